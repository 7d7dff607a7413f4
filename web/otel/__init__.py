"""OpenTelemetry export of the turn trace (docs/observability.md): `spans` turns a finished TurnTrace into a span tree
(pure), `export` sends the trees over OTLP with the official SDK without ever holding up a turn."""
