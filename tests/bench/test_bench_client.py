"""The scripted benchmark client against the mock server: it streams whole 20 ms frames,
waits for each reply to play out before speaking again, marks playback and measures from its own clock."""
from __future__ import annotations

from typing import Any

import numpy as np

from bench._client import FRAME_SAMPLES, RATE, Prompt, ScriptedSession
from desktop.connection import ServerInfo
from support.mock_server import CANNED_STAGES, REPLY_TEXT, TRANSCRIPT, MockState, port_of, start_mock, sine_pcm
from web.protocol import pack_audio

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


class _MarksSent:
    """Where the client sends its playback marks, in the scripted timeline below."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    async def send_json(self, msg: Any) -> None:
        self.sent.append(msg)


async def test_the_silence_heard_inside_a_reply_on_a_scripted_timeline() -> None:
    """Arrival times given, not measured: 100 ms chunks at 0, 50 and 100 ms have played out at 300 ms, so a fourth
    at 1150 ms leaves 850 ms of silence; chunks that keep ahead of the player add none."""
    session = ScriptedSession("127.0.0.1:9")
    session.info = ServerInfo("s", RATE, 22050, "assistant", "joe", ("assistant",), ("joe",))
    session._conn = _MarksSent()  # type: ignore[assignment]
    chunk = sine_pcm(0.1, rate=22050)
    for seq, at_s in enumerate([10.0, 10.05, 10.1, 11.15, 11.2]):
        await session._on_audio(pack_audio(1, seq, chunk), at_s)
    assert len(session._conn.sent) == 1  # type: ignore[attr-defined]  # playback reported once, as it started
    assert abs(session._turns[1].longest_gap_s - 0.85) < 1e-9, session._turns[1].longest_gap_s
    for seq, at_s in enumerate([20.0, 20.05, 20.1, 20.15]):
        await session._on_audio(pack_audio(2, seq, chunk), at_s)
    assert session._turns[2].longest_gap_s == 0.0


async def test_a_reply_whose_speech_stalls_reports_the_silence_heard() -> None:
    """Three 100 ms chunks, then 1 s without audio, against the same reply with no stall in the same test: the
    stalled one is heard with a longer silence inside it (the exact arithmetic is the scripted test's above; over a
    socket the arrival times are this machine's)."""
    gaps = []
    for state in (MockState(reply_s=1.0), MockState(reply_s=1.0, stall_after=3, stall_s=1.0)):
        server = await start_mock(state)
        try:
            results = await ScriptedSession(f"127.0.0.1:{port_of(server)}", gap_ms=100).run([loud_prompt("stall")])
        finally:
            server.close()
            await server.wait_closed()
        assert results[0].error is None and results[0].reply.endswith(REPLY_TEXT)
        gaps.append(results[0].reply_gap_ms)
    smooth, stalled = gaps
    assert stalled > smooth, gaps


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
