"""Past one machine, for real: `parley serve` with recognition, the LLM and the voice all `backend: openai`,
pointed at stage servers on loopback, one per stage as deploy/ runs them (`parley stages --only llm` for the LLM,
one `--only asr,tts` for the rest, which also shows that a stage server may hold several). A spoken question is
answered end to end; with the LLM's stage server killed the client is told why and the session lives; after a
restart the next turn is answered."""
from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from bench import corpus
from server_config import TOKEN
from server_process import ServerProcess
from voice.audio import pcm16_to_float, resample
from ws_client import Client

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

KEY_ENV = "PARLEY_TEST_STAGES_KEY"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def split(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    root = tmp_path_factory.mktemp("split")
    port = free_port()  # fixed, so the LLM's stage server comes back where the front end looks for it
    llm = ServerProcess(root / "llm", command="stages", port=port, stages=["llm"])
    speech = ServerProcess(root / "speech", command="stages", stages=["asr", "tts"])
    front = None
    try:
        with ThreadPoolExecutor(2) as pool:  # the two stage servers start together: each is mostly imports
            for started in [pool.submit(proc.start) for proc in (llm, speech)]:
                started.result()
        to_llm = {"base_url": f"http://127.0.0.1:{port}/v1", "api_key_env": KEY_ENV, "timeout_s": 20}
        to_speech = {**to_llm, "base_url": f"http://127.0.0.1:{speech.port}/v1"}
        more = {"models": {"asr": {"backend": "openai", "remote": to_speech}, "llm": {"backend": "openai", "remote": to_llm}},
                "voices": {"joe": {"backend": "openai", "remote": to_speech, "speaker": "joe"}}}  # fmt: skip
        front = ServerProcess(root / "front", env={KEY_ENV: TOKEN}, more=more).start()
        yield llm, front
    finally:
        for proc in (front, speech, llm):
            if proc is not None:
                proc.stop()


def spoken(text: str) -> np.ndarray:
    audio, rate = corpus.speak_piper(text, deterministic=True)
    return np.concatenate([corpus.silence(300), corpus.to_16k(audio, rate), corpus.silence(1500)])


async def ask(c: Client, text: str, n: int) -> tuple[dict, dict]:
    await c.stream(spoken(text))
    final = await c.wait_for("transcript.final", n=n, timeout_s=120)
    done = await c.wait_for("response.done", turn_id=final["turn_id"], timeout_s=120)
    return final, done


async def test_a_spoken_question_through_remote_stages_and_a_stage_server_that_goes_away(split) -> None:
    stages, front = split
    async with Client(front.ws_url(TOKEN)) as c:
        ready = await c.start(persona="concise")
        assert ready["output_sample_rate"] == 24000  # the speech server's rate: no Piper voice is local
        await c.wait_for("response.done")  # the greeting, spoken by the stage server
        question = corpus.REQUESTS[0]
        final, done = await ask(c, question, 1)
        assert corpus.wer(question, final["text"]) <= 0.15, final["text"]
        assert done["text"].strip() and not done["interrupted"]
        audio = resample(pcm16_to_float(c.turn_audio(final["turn_id"])), 24000, 16000)
        assert len(audio) > 0.5 * 16000  # spoken, at the session's rate
        trace = await c.wait_for("turn.trace", turn_id=final["turn_id"])
        assert trace["stages_ms"]["llm_ttft"] > 0 and "asr" in trace["stages_ms"]  # the remote stages, timed

        stages.kill()  # the LLM's stage server dies mid-session
        await c.stream(spoken(corpus.REQUESTS[1]))
        error = await c.wait_for("error", timeout_s=120)
        assert error["code"] in ("stage_failed", "reply_failed") and not error["fatal"]
        assert f"127.0.0.1:{stages.port}" in error["message"], error["message"]

        await asyncio.to_thread(stages.start)  # the loop answers the session's pings while it loads
        question = corpus.REQUESTS[2]
        finals = len(c.of("transcript.final"))
        final, done = await ask(c, question, finals + 1)
        assert corpus.wer(question, final["text"]) <= 0.15 and done["text"].strip()
