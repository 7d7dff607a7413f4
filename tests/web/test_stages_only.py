"""One stage server per stage: `parley stages --only tts` loads and answers for speech alone; the other stages'
routes say they are not served (404 in OpenAI's shape), /v1/models lists what is, /healthz says which."""
from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from cli import main as cli
from parley import runtime as rt
from parley.config import ConfigError, load_config
from web.openai_api.app import create_stages_app


def only(flag: str) -> tuple[str, ...]:
    return cli._load(cli._parser().parse_args(["stages", "--only", flag])).server.stages


def test_only_names_the_stages_and_refuses_unknown_ones() -> None:
    assert only("llm") == ("llm",) and only("asr,tts") == ("asr", "tts")
    assert load_config(None).server.stages == ("asr", "llm", "tts")
    for bad in ("nope", "llm,llm"):
        with pytest.raises(ConfigError, match="server.stages"):
            only(bad)


@pytest.mark.slow
def test_a_speech_only_stage_server() -> None:
    cfg = load_config(None, ["server.stages=[tts]"])
    app = create_stages_app(cfg)
    with TestClient(app, base_url="http://127.0.0.1") as client:  # the lifespan loads what server.stages names
        health = client.get("/healthz").json()
        assert health["stages"] == ["tts"] and "engine_slots" not in health
        assert "tts" in health["load_s"] and not {"asr", "llm"} & set(health["load_s"])  # neither was loaded
        assert [(m["id"], m["owned_by"]) for m in client.get("/v1/models").json()["data"]] == [("parley-tts", "parley (speech)")]

        chat = client.post("/v1/chat/completions", json={"model": "x", "messages": [{"role": "user", "content": "Hi"}]})
        heard = client.post("/v1/audio/transcriptions", files={"file": ("a.wav", b"RIFF", "audio/wav")})
        for r, what in ((chat, "chat completions"), (heard, "speech recognition")):
            assert r.status_code == 404, r.text
            error = r.json()["error"]
            assert error["code"] == "stage_not_served" and what in error["message"] and "tts" in error["message"]

        spoken = client.post("/v1/audio/speech", json={"model": "tts-1", "input": "Hello there.", "voice": "alloy",
                                                        "response_format": "pcm"})  # fmt: skip
        assert spoken.status_code == 200 and len(spoken.content) > 4800  # more than 0.1 s of 24 kHz PCM16
        assert "parley_tts_active" in client.get("/metrics").text


def test_a_stage_not_loaded_says_so_when_touched() -> None:
    with pytest.raises(AttributeError, match="llm is not served by this process"):
        rt.NotServed("llm").active_slots()
    assert getattr(rt.NotServed("asr"), "spec", None) is None  # getattr with a default still answers it
