"""A spoken "what time is it?" in a voice session on the embedded models, over a real socket: the reply calls the
time tool, the trace has its `tool` stage, and the answer made from the tool's result is spoken.

The 135M model seldom chooses a tool by itself (docs/tools.md), so this persona forces the time tool with
`tool_choice: current_time`; the call's arguments, the tool run and the answer are the model's and the tool's own.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml

from bench import corpus
from in_thread import serve_in_thread
from parley import runtime as rt
from parley.config import load_config
from server_config import TOKEN, write_test_config
from voice.audio import pcm16_to_float, resample
from web.app import create_app
from ws_client import Client

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

QUESTION = "What time is it?"


@pytest.fixture(scope="module")
def tool_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, rt.Runtime]]:
    root = tmp_path_factory.mktemp("tools")
    path = write_test_config(root)
    persona = root / "configs" / "personas" / "assistant.yaml"
    data = yaml.safe_load(persona.read_text())
    persona.write_text(yaml.safe_dump({**data, "tools": ["default"], "tool_choice": "current_time", "max_reply_tokens": 30}))
    cfg = load_config(path)
    runtime = rt.load_and_warm(cfg)
    app = create_app(cfg, runtime=runtime)
    with serve_in_thread(app, "tools-server", ws_max_size=cfg.server.max_message_bytes) as port:
        yield port, runtime
    runtime.close()


@pytest.fixture(scope="module")
def question_16k() -> np.ndarray:
    audio, rate = corpus.speak_piper(QUESTION)
    return np.concatenate([corpus.silence(300), corpus.to_16k(audio, rate), corpus.silence(1200)])


async def test_spoken_what_time_is_it_runs_the_time_tool_and_speaks_the_answer(tool_server, question_16k) -> None:
    from llm_engine import constrain

    port, runtime = tool_server
    misses = constrain._ll_tokenizer.cache_info().misses
    async with Client(f"ws://127.0.0.1:{port}/ws?token={TOKEN}") as c:
        await c.start()
        await c.wait_for("response.done")  # the greeting (fixed words: no tool)
        await c.stream(question_16k)
        final = await c.wait_for("transcript.final")
        turn = final["turn_id"]
        trace = await c.wait_for("turn.trace", turn_id=turn, timeout_s=180)
        done = c.of("response.done", turn)[0]
    assert corpus.wer(QUESTION, final["text"]) <= 0.25, final["text"]
    assert constrain._ll_tokenizer.cache_info().misses == misses  # the grammar's tokenizer view was built at load
    assert trace["tools"][0]["name"] == "current_time" and trace["tools"][0]["ok"] is True, trace.get("tools")
    assert trace["stages_ms"]["tool"] >= 0 and "voice_to_voice" in trace["stages_ms"]
    assert trace["marks_ms"]["tool_done"] <= trace["marks_ms"]["first_audio_sent"] or "Let me" in done["text"]
    assert not done["interrupted"] and done["text"].strip() and "<tool_call>" not in done["text"]
    # what was sent is speech saying the reply's words
    heard = runtime.stages.transcriber.transcribe(resample(pcm16_to_float(c.turn_audio(turn)), 22050, 16000)).text
    said = [w for w in _words(done["spoken_text"]) if w.isalpha()]  # (a 135M model's digits garble: words only)
    assert said and sum(w in _words(heard) for w in said) >= len(said) / 2, (done["spoken_text"], heard)
    print(f"\nreply to {final['text']!r}: {done['text']!r}; tool {trace['tools'][0]}; stages {trace['stages_ms']}")


def _words(text: str) -> list[str]:
    return "".join(ch if ch.isalnum() else " " for ch in text.lower().replace("_", " ")).split()
