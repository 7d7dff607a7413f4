"""The scripted benchmark client against the mock server: it streams whole 20 ms frames,
waits for each reply to play out before speaking again, marks playback and measures from its own clock."""
from __future__ import annotations

import numpy as np

from bench._client import FRAME_SAMPLES, RATE, Prompt, ScriptedSession
from support.mock_server import CANNED_STAGES, REPLY_TEXT, TRANSCRIPT, MockState, port_of, start_mock

def loud_prompt(text: str, speech_ms: int = 500, seed: int = 0) -> Prompt:
    rng = np.random.default_rng(seed)
    speech = (rng.standard_normal(RATE * speech_ms // 1000) * 0.2).astype(np.float32)
    return Prompt(text, "noise", np.concatenate([speech, np.zeros(RATE // 10, np.float32)]), float(speech_ms))


async def test_two_turns_in_one_conversation() -> None:
    state = MockState(reply_s=1.0)
    server = await start_mock(state)
    try:
        session = ScriptedSession(f"127.0.0.1:{port_of(server)}", gap_ms=100)
        results = await session.run([loud_prompt("first"), loud_prompt("second", seed=1)])
    finally:
        server.close()
        await server.wait_closed()
    assert [r.turn_id for r in results] == [1, 2]
    assert all(r.error is None and r.transcript == TRANSCRIPT for r in results)
    assert all(r.reply.endswith(REPLY_TEXT) for r in results)
    assert [r.trace["stages_ms"]["voice_to_voice"] for r in results] == [CANNED_STAGES["voice_to_voice"]] * 2  # type: ignore[index]
    # measured from the last voiced frame, which the mock needs before it can answer at all
    assert all(r.client_v2v_ms is not None and r.client_v2v_ms > 0 for r in results)
    assert state.marks == [(1, 0.0), (2, 0.0)]  # playback reported as it started, as the browser does
    assert state.audio_bytes % (FRAME_SAMPLES * 2) == 0  # whole 20 ms frames only
    assert state.audio_bytes >= 2 * len(loud_prompt("x").audio) * 2
    assert session.errors == []
    assert all(r.reply_gap_ms < 700 for r in results)  # a reply sent at twice real time never stalls that long


async def test_a_reply_whose_speech_stalls_reports_the_silence_heard() -> None:
    """Three 100 ms chunks, then 1 s without audio: the client has played them out ~0.85 s before the fourth."""
    state = MockState(reply_s=1.0, stall_after=3, stall_s=1.0)
    server = await start_mock(state)
    try:
        results = await ScriptedSession(f"127.0.0.1:{port_of(server)}", gap_ms=100).run([loud_prompt("stall")])
    finally:
        server.close()
        await server.wait_closed()
    assert results[0].error is None and results[0].reply.endswith(REPLY_TEXT)
    assert results[0].reply_gap_ms >= 700, results[0].reply_gap_ms


async def test_a_turn_the_server_never_answers_is_an_error_and_ends_the_conversation() -> None:
    state = MockState()
    server = await start_mock(state)
    try:
        silent = Prompt("nothing", "silence", np.zeros(RATE // 2, np.float32), 0.0)
        results = await ScriptedSession(f"127.0.0.1:{port_of(server)}", turn_timeout_s=1.5).run([silent, silent])
    finally:
        server.close()
        await server.wait_closed()
    # the conversation stops there: a reply arriving late would otherwise be taken for the next turn's
    assert len(results) == 1 and results[0].turn_id is None and results[0].trace is None
    assert results[0].error is not None and "no turn.trace" in results[0].error
    assert results[0].client_v2v_ms is None
