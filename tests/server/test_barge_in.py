"""Barge-in and disconnects over a real socket on the embedded models: speech during a reply clears it and
history keeps only what was spoken; a 150 ms noise burst does not interrupt; a client that leaves mid-reply
leaves no session task, engine slot or TTS work behind."""
from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest

from bench import corpus
from parley.config import DEFAULT_CONFIG, load_config
from server_config import TOKEN
from ws_client import Client

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

STORY = "Tell me a long story about a brave knight who fights a dragon in the mountains."
INTERRUPTION = "Wait, stop please, I have another question."


async def _reply_playing(c: Client) -> int:
    """Start a typed turn after the greeting; return its turn id once its audio is arriving."""
    greeting = await c.wait_for("response.done")
    await c.send(type="input.text", text=STORY)
    turn = greeting["turn_id"] + 1
    await c.wait_for("audio", turn_id=turn)
    return turn


async def _health(live_server) -> dict:
    async with httpx.AsyncClient(base_url=live_server.http, headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        return (await http.get("/healthz")).json()


async def test_speech_during_reply_clears_it_within_300ms_and_history_keeps_the_spoken_part(live_server) -> None:
    # the shipped barge-in minimum, not a test override, is what must meet the 300 ms bound
    assert live_server.cfg.vad.barge_in_min_speech_ms == load_config(DEFAULT_CONFIG).vad.barge_in_min_speech_ms == 200
    speech, rate = corpus.speak_piper(INTERRUPTION)
    speech = corpus.to_16k(speech, rate)
    onset_ms, _ = corpus.speech_bounds_ms(speech, corpus.ASR_RATE)
    async with Client(live_server.ws_url()) as c:
        ready = await c.start()
        turn = await _reply_playing(c)
        # a 150 ms noise burst, then quiet: not an interruption
        # (checked below, from the first clear: the server hears audio in order, so a clear the noise caused would
        # come before the one the speech causes)
        await c.stream(np.concatenate([corpus.silence(200), corpus.white_noise(150, level=0.3), corpus.silence(700)]))
        # real speech: the reply is cleared
        start_ms = c.audio_sent_ms
        await c.stream(np.concatenate([speech, corpus.silence(1200)]))
        clear = await c.wait_for("response.audio.clear")
        done = await c.wait_for("response.done", turn_id=turn)
        assert clear["turn_id"] == turn and done["interrupted"]
        assert clear["t_ms"] > start_ms, (clear, start_ms)  # the first clear was decided on the speech, not the noise
        # the server's audio clock is the client's (both count the samples streamed): the clear was decided
        # within 300 ms of audio after the speech began, and reached the client while the user still spoke
        decided_ms = clear["t_ms"] - (start_ms + onset_ms)
        assert 0 < decided_ms <= 300.0, decided_ms
        assert clear["audio_sent_ms"] < start_ms + len(speech) / 16.0
        # no audio of the cleared turn after the clear
        at = c.messages.index(clear)
        assert not [m for m in c.messages[at:] if m["type"] == "audio" and m["turn_id"] == turn]
        # history holds the spoken prefix, not the whole reply
        spoken, full = done["spoken_text"].split(), done["text"].split()
        assert len(spoken) < len(full)
        session = live_server.state.sessions[ready["session_id"]]
        assert ("user", STORY) in session.history
        assistant = [text for role, text in session.history if role == "assistant"]
        assert assistant[-1] == done["spoken_text"] and done["text"].strip() not in assistant
        # the interruption becomes the next request, answered whole: the pause after "Wait," may end a turn early,
        # and the rest of the sentence then joins it (vad.speech_started joins)
        await c.stream(corpus.silence(8000), until=lambda: any(
            not d["interrupted"] for d in c.of("response.done") if d["turn_id"] > turn))  # fmt: skip
        answered = next(d["turn_id"] for d in c.of("response.done") if d["turn_id"] > turn and not d["interrupted"])
        final = c.of("transcript.final", turn_id=answered)[0]
        assert corpus.wer(INTERRUPTION, final["text"]) <= 0.3, final["text"]
        chain = []  # the joins of the last speech starts: each early turn joined by the next, up to the answered one
        for m in reversed(c.of("vad.speech_started")):
            if m.get("joins") is None:
                break
            chain.insert(0, m["joins"])
        assert chain == list(range(answered - len(chain), answered)) and answered - len(chain) > turn, (chain, answered)
        await c.wait_for("turn.trace", turn_id=answered, timeout_s=120)
    assert await _engine_idle(live_server)  # the cancelled generation does not linger in the engine


async def _engine_idle(live_server) -> bool:
    for _ in range(100):  # bounded wait: a cancel lands within an engine step
        if not live_server.runtime.engine.scheduler.running():
            return True
        await asyncio.sleep(0.1)
    return False


KEYS = ("connections", "sessions", "session_tasks", "engine_slots", "tts_active")


async def test_client_leaving_mid_reply_leaves_nothing_behind(live_server) -> None:
    async with Client(live_server.ws_url()) as c:
        await c.start()
        await _reply_playing(c)
        during = await _health(live_server)
        assert during["sessions"] >= 1 and during["engine_slots"] >= 1
    health = {}
    for _ in range(100):  # wait (bounded) for the server to notice and clean up; no speed is asserted
        health = await _health(live_server)
        if [health[k] for k in KEYS] == [0] * len(KEYS):
            break
        await asyncio.sleep(0.1)
    assert {k: health[k] for k in KEYS} == dict.fromkeys(KEYS, 0)
    assert await _engine_idle(live_server)
