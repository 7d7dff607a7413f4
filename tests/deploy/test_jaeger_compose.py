"""deploy/compose.jaeger.yaml checked against the base compose file and the code, without Docker: every Parley
process gets an OTLP endpoint that names the Jaeger service on a port it exposes, and with those variables the
real telemetry turns on under the process's own service name."""
from __future__ import annotations

from urllib.parse import urlsplit

import yaml

from deploy_topology import DEPLOY, merge
from parley.config import ObservabilityConfig
from web.otel.export import Telemetry
from web.otel.spans import LlmFacts


def test_every_parley_process_exports_to_the_jaeger_service() -> None:
    base = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    over = yaml.safe_load((DEPLOY / "compose.jaeger.yaml").read_text())
    merged = merge(base, over)
    services = merged["services"]
    parley = [n for n, s in base["services"].items() if "build" in s or str(s.get("image", "")).startswith("parley")]
    assert parley and set(parley) <= set(over["services"])
    names = set()
    for name in parley:
        env = services[name]["environment"]
        assert "PARLEY_STAGES_KEY" in env, f"{name}: the override must add to the environment, not replace it"
        url = urlsplit(env["OTEL_EXPORTER_OTLP_ENDPOINT"])
        assert url.hostname in services and str(url.port) in services[url.hostname]["expose"]
        assert "jaeger" in services[url.hostname]["image"]
        names.add(env["OTEL_SERVICE_NAME"])
        tel = Telemetry(ObservabilityConfig(), LlmFacts("m", "parley"), env={k: str(v) for k, v in env.items()})
        try:
            assert tel.enabled and tel.target == "env" and tel.service_name == env["OTEL_SERVICE_NAME"]
        finally:
            tel.shutdown()
    assert len(names) == len(parley)  # each process tells itself apart
