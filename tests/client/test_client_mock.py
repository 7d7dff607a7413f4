"""DesktopClient against the scripted mock server with a fake sound card: turns, playback,
barge-in, persona switch, reconnect, and the connection failures a user can hit."""
from __future__ import annotations

import asyncio
import io
import time

import numpy as np
import pytest
from rich.console import Console

from support.mock_server import REPLY_TEXT, TRANSCRIPT, MockState, port_of, start_mock
from support.sounds import speechlike
from support.waiting import wait_for
from desktop.app import ClientOptions, DesktopClient
from desktop.audio_io import ArrayAudioIO
from desktop.connection import ConnectError, Connection, backoff_s, ws_url
from desktop.tui import latency_table


def make_client(port: int, **kw: object) -> tuple[DesktopClient, ArrayAudioIO]:
    audio = ArrayAudioIO(input_rate=48000, output_rate=44100)  # device rates differ from the wire's
    opts = ClientOptions(url=f"ws://127.0.0.1:{port}/ws", echo="off", **kw)  # type: ignore[arg-type]
    return DesktopClient(opts, audio), audio


async def started(client: DesktopClient) -> asyncio.Task[int]:
    task = asyncio.create_task(client.run())
    await wait_for(client.ready.is_set, what="session.ready")
    return task


async def finish(client: DesktopClient, task: asyncio.Task[int]) -> int:
    client.stop()
    return await asyncio.wait_for(task, 5)


def rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(x ** 2))) if len(x) else 0.0


def test_ws_url_forms() -> None:
    assert ws_url("127.0.0.1:8000") == "ws://127.0.0.1:8000/ws"
    assert ws_url("http://example.org:9000/") == "ws://example.org:9000/ws"
    assert ws_url("https://example.org") == "wss://example.org/ws"
    assert ws_url("ws://h:1/custom") == "ws://h:1/custom"
    with pytest.raises(ValueError):
        ws_url("ftp://h")
    assert [backoff_s(i) for i in range(5)] == [0.25, 0.5, 1.0, 2.0, 2.0]


async def test_full_turn_plays_reply_marks_playback_and_fills_latency(mock: tuple[MockState, int]) -> None:
    state, port = mock
    state.reply_s = 2.0
    client, audio = make_client(port, persona="concise")
    task = await started(client)
    assert state.starts[0]["persona"] == "concise" and state.starts[0]["sample_rate"] == 16000
    said_s = time.monotonic()
    audio.say(speechlike(0.8), 16000)
    await wait_for(lambda: any(e["type"] == "turn.trace" for e in client.events), what="turn.trace")
    await wait_for(lambda: client.jitter.status(1) is not None and client.jitter.status(1).finished, what="playback")
    elapsed_ms = 1000.0 * (time.monotonic() - said_s)  # speech, endpointing, reply and its playback, on this machine
    await wait_for(lambda: any(t == 1 and m > 1900 for t, m in state.marks), what="the last playback.mark")
    assert await finish(client, task) == 0

    assert client.view.user_text == TRANSCRIPT and client.view.reply.strip() == REPLY_TEXT
    played = audio.played()
    assert 1.9 < np.count_nonzero(np.abs(played) > 0.01) / 44100 < 2.1  # the 2.0 s tone, resampled to 44.1 kHz
    assert 0.18 < rms(played[np.abs(played) > 0.01]) < 0.24  # 0.3 * sin -> rms 0.21
    marks = [m for t, m in state.marks if t == 1]
    assert marks == sorted(marks) and 1900 < marks[-1] <= 2001  # the server learns what was heard
    row = client.latency.get(1)
    assert row is not None and row.stages_ms["voice_to_voice"] == 1453.0 and row.over_budget == ("tts",)
    # at least the mock's 400 ms of silence before it ends the turn; within what this test waited since speaking
    assert row.mic_to_ear_ms is not None and 400 < row.mic_to_ear_ms < elapsed_ms - 800, (row.mic_to_ear_ms, elapsed_ms)
    text = io.StringIO()
    Console(file=text, width=200).print(latency_table(client.view.turns, client.view.budgets_ms))
    table = text.getvalue()
    assert "1453" in table and "mic→ear" in table and "what is" in table and f"{row.mic_to_ear_ms:.0f}" in table
    # the client's own playback start: measured here, shown, and sent once with the turn's first mark
    assert row.client_playback_ms is not None and row.client_playback_ms >= 0 and row.output_latency_ms == 0.0
    play = next(c for c in latency_table(client.view.turns, client.view.budgets_ms).columns if c.header == "play")
    assert [cell.plain for cell in play.cells] == [f"{r.client_playback_ms:.0f}" for r in client.view.turns]
    assert row.underruns == 0
    starts = [m["start_ms"] for m in state.mark_bodies if m["turn_id"] == 1 and m.get("start_ms") is not None]
    assert starts == [round(row.client_playback_ms, 1)]
    assert all(m.get("underruns") == 0 for m in state.mark_bodies if m["turn_id"] == 1)


async def test_barge_in_clear_stops_playback_at_once(mock: tuple[MockState, int]) -> None:
    state, port = mock
    state.reply_s = 6.0
    client, audio = make_client(port)
    task = await started(client)
    audio.say(speechlike(0.6), 16000)
    await wait_for(lambda: client.view.state == "speaking" and len(audio.played()) > 44100, what="reply audio")
    await asyncio.sleep(0.5)
    audio.say(speechlike(0.6, seed=9), 16000)  # the user talks over the reply
    await wait_for(lambda: any(e["type"] == "response.audio.clear" for e in client.events), what="clear")
    cleared_at = len(audio.played())
    # half a second of speaker output after the clear, counted in samples the speaker took, not in wall time
    await wait_for(lambda: len(audio.played()) >= cleared_at + 44100 // 50 + 22050, what="speaker output after the clear")
    after = audio.played()[cleared_at + 44100 // 50:]  # one 20 ms block may already be out
    assert rms(after) < 0.01  # nothing of the 6 s reply plays after the clear
    assert client.jitter.status(1).played_ms < 4000
    done = [e for e in client.events if e["type"] == "response.done"]
    assert done[0]["interrupted"] is True
    await wait_for(lambda: client.latency.get(2) is not None, what="second turn")
    assert await finish(client, task) == 0


async def test_client_interrupt_sends_cancel_and_clears(mock: tuple[MockState, int]) -> None:
    state, port = mock
    state.reply_s = 5.0
    client, audio = make_client(port)
    task = await started(client)
    await client.send_text("tell me something")
    await wait_for(lambda: len(audio.played()) > 0 and client.jitter.playing(), what="reply")
    await client.interrupt()
    assert not client.jitter.playing()
    await wait_for(lambda: state.cancels == 1, what="cancel at server")
    assert state.texts == ["tell me something"]
    assert await finish(client, task) == 0


async def test_persona_switch_round_trip(mock: tuple[MockState, int]) -> None:
    state, port = mock
    client, _ = make_client(port)
    task = await started(client)
    assert client.view.persona == "assistant"
    await client.next_persona()
    await wait_for(lambda: client.view.persona == "concise", what="persona update")
    await wait_for(lambda: client.view.reply.strip() == "Short answers, then.", what="the new persona's greeting")
    assert state.updates == [{"type": "session.update", "persona": "concise"}]
    assert client.info is not None and client.info.personas == ("assistant", "concise", "storyteller")
    assert await finish(client, task) == 0


async def test_reconnects_after_server_restart_and_keeps_persona() -> None:
    state = MockState()
    server = await start_mock(state)
    port = port_of(server)
    client, audio = make_client(port, persona="storyteller")
    task = await started(client)
    server.close()
    await server.wait_closed()
    await wait_for(lambda: client.view.state == "reconnecting", what="reconnecting")
    await asyncio.sleep(0.6)  # a restart takes a moment
    server = await start_mock(state, port)
    try:
        await wait_for(lambda: client.connects == 2 and client.ready.is_set(), what="reconnect")
        assert [s["persona"] for s in state.starts] == ["storyteller", "storyteller"]
        audio.say(speechlike(0.6), 16000)
        await wait_for(lambda: client.latency.get(1) is not None and client.view.reply != "", what="turn after restart")
        assert await finish(client, task) == 0
    finally:
        server.close()
        await server.wait_closed()


async def test_unreachable_server_is_one_clear_line() -> None:
    conn = Connection("ws://127.0.0.1:9/ws", None, open_timeout_s=2)
    with pytest.raises(ConnectError) as err:
        await conn.open(None, None)
    assert err.value.retry and "cannot reach a Parley server at ws://127.0.0.1:9/ws" in str(err.value)
    client, _ = make_client(9)
    assert await asyncio.wait_for(client.run(), 10) == 1  # first connect fails: no retry loop
    assert "cannot reach" in client.view.notice


@pytest.mark.parametrize("refusal", ["message", "http"])
async def test_wrong_token_is_rejected_without_retry(refusal: str) -> None:
    state = MockState(token="sesame", token_refusal=refusal)
    server = await start_mock(state)
    try:
        client, _ = make_client(port_of(server), token="wrong")
        assert await asyncio.wait_for(client.run(), 10) == 1
        expected = "missing or wrong token" if refusal == "message" else "rejected the token (HTTP 401)"
        assert expected in client.view.notice and "--token" in client.view.notice
        assert state.sessions == 0
        good, _ = make_client(port_of(server), token="sesame")
        task = await started(good)
        assert await finish(good, task) == 0
    finally:
        server.close()
        await server.wait_closed()


async def test_push_to_talk_sends_only_while_talking_and_talking_interrupts(mock: tuple[MockState, int]) -> None:
    state, port = mock
    state.reply_s = 5.0
    client, audio = make_client(port, push_to_talk=True)
    task = await started(client)
    sent_before = state.audio_bytes
    audio.say(speechlike(0.6), 16000)
    await wait_for(audio.mic_idle.is_set, what="speech played into the microphone")
    # the server judges audio as it arrives: once it has had more than the speech's length, it has judged all of it
    await wait_for(lambda: state.audio_bytes - sent_before > 0.9 * 16000 * 2, what="the speech's stretch of the stream")
    assert state.speech_starts == 0  # not talking: silence was sent, but the stream went on (the server keeps time)
    client.set_talking(True)
    audio.say(speechlike(0.6), 16000)
    await wait_for(lambda: client.jitter.playing(), what="reply")
    client.set_talking(False)
    client.set_talking(True)  # pressing talk while the assistant speaks interrupts it
    await wait_for(lambda: state.cancels == 1, what="response.cancel")
    assert not client.jitter.playing()
    assert await finish(client, task) == 0


def test_file_backed_audio_io_plays_a_wav_and_saves_the_speaker(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import time

    import soundfile as sf

    from desktop.audio_io import file_audio_io, save_played

    sf.write(tmp_path / "mic.wav", np.stack([speechlike(0.2, 8000)] * 2, axis=1), 8000)  # stereo, 8 kHz
    io = file_audio_io(tmp_path / "mic.wav", input_rate=16000, output_rate=16000, echo_gain=0.5, echo_delay_ms=40)
    mic: list[np.ndarray] = []
    io.start(lambda block, t: mic.append(block), lambda n: np.full(n, 0.2, np.float32))
    deadline = time.monotonic() + 10.0
    while sum(len(b) for b in mic) < 3200 + 640 + 1600 and time.monotonic() < deadline:  # the file, then 100 ms of echo
        time.sleep(0.01)
    io.stop()
    heard = np.concatenate(mic)
    assert io.mic_idle.is_set() and rms(heard[:3200]) > 0.05  # the file, resampled to 16 kHz
    tail = heard[3200 + 640:]
    assert len(tail) >= 1600 and np.allclose(tail, 0.1, atol=1e-6)  # then only the speaker's echo: 0.2 * 0.5
    save_played(io, tmp_path / "out.wav")
    out, rate = sf.read(tmp_path / "out.wav", dtype="float32")
    assert rate == 16000 and np.allclose(out, 0.2, atol=1e-4)


async def test_a_typed_turn_is_labelled_by_its_trace_not_by_the_greeting_before_it(mock: tuple[MockState, int]) -> None:
    """On a slow server a persona switch's greeting (a reply without a trace) can start after a typed text was
    sent: the typed turn's row, not the greeting's, carries the text."""
    state, port = mock
    client, _ = make_client(port)
    task = await started(client)
    await client.send_text("what time is it")
    # the greeting's first delta, as the server sends it, before the typed turn's own reply can arrive
    client._on_message({"type": "response.text.delta", "turn_id": 99, "text": "Short"})
    await wait_for(lambda: any(e["type"] == "turn.trace" for e in client.events), what="the typed turn's trace")
    trace = next(e for e in client.events if e["type"] == "turn.trace")
    labels = {row.turn_id: row.user_text for row in client.latency.rows()}
    assert trace["input"] == "text" and labels[trace["turn_id"]] == "what time is it"
    assert labels.get(99, "") == ""
    assert await finish(client, task) == 0
