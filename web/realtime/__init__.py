"""OpenAI's Realtime API at /v1/realtime: a protocol adapter over the same voice Session as /ws (docs/realtime.md)."""
