"""The browser client against the mock server: UI behaviour in seconds, no models.

Covers what the page does with each protocol event (transcripts, reply text and audio, waterfall,
barge-in, persona switch, errors, reconnect), phone layout and keyboard access.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bench import corpus
from browser_harness import MockProcess, mic_wav, mock_server, page_stats, restart_and_expect_reconnect, wait_page

pytestmark = pytest.mark.browser

QUESTION = "What is the weather like today?"


stats = page_stats


def open_page(page, server: MockProcess) -> None:
    page.goto(server.url)
    page.wait_for_selector("#conn[data-phase=up]")


@pytest.fixture(scope="module")
def question_wav(tmp_path_factory) -> Path:
    return mic_wav(tmp_path_factory.mktemp("wav") / "question.wav",
                   [("silence", 800), ("say", QUESTION), ("silence", 30000)])


def test_protocol_helpers_in_the_page(launch, mock) -> None:
    page = launch()
    open_page(page, mock)
    got = page.evaluate("""async () => {
        const p = await import('./protocol.js');
        const buf = new ArrayBuffer(8 + 6);
        const v = new DataView(buf);
        v.setUint32(0, 7, true); v.setUint32(4, 3, true);
        v.setInt16(8, -32768, true); v.setInt16(10, 1, true); v.setInt16(12, 32767, true);
        const f = p.parseAudioFrame(buf);
        return {
          turnId: f.turnId, seq: f.seq, pcm: Array.from(f.pcm),
          p50: p.percentile([5, 1, 4, 2, 3], 50), p95: p.percentile([5, 1, 4, 2, 3], 95), none: p.percentile([], 50),
          backoff: [0, 1, 2, 3, 4, 5, 9].map((a) => p.backoffMs(a, () => 0)),
          url: p.socketUrl('http://127.0.0.1:9/?token=abc'), frame: p.FRAME_SAMPLES,
          marks: [p.playbackMark(2, 12.6), p.playbackMark(2, 0, false, { startMs: 33.456, underruns: 0 }),
                  p.playbackMark(2, 5, true, { startMs: null, underruns: 2 }), p.playbackMark(2, 0, false, { startMs: -3 })],
        };
    }""")
    assert got["turnId"] == 7 and got["seq"] == 3 and got["pcm"] == [-32768, 1, 32767]
    assert (got["p50"], got["p95"], got["none"]) == (3, 5, None)
    assert got["backoff"] == [500, 1000, 2000, 4000, 8000, 8000, 8000]
    assert got["url"] == "ws://127.0.0.1:9/ws?token=abc"
    assert got["frame"] == 320
    assert got["marks"] == [  # the client's own playback start and underruns ride along only when measured
        {"type": "playback.mark", "turn_id": 2, "played_ms": 13},
        {"type": "playback.mark", "turn_id": 2, "played_ms": 0, "start_ms": 33.5, "underruns": 0},
        {"type": "playback.mark", "turn_id": 2, "played_ms": 5, "paused": True, "underruns": 2},
        {"type": "playback.mark", "turn_id": 2, "played_ms": 0}]


def test_speech_run_finds_the_onset_and_forgives_short_gaps(launch, mock) -> None:
    page = launch()
    open_page(page, mock)
    got = page.evaluate("""async () => {
        const { SpeechRun } = await import('./speech-run.js');
        const run = new SpeechRun();
        const seen = [];
        // 20 ms frames: 2 soft, 5 voiced, 3 silent (60 ms gap, forgiven), 4 voiced, 5 silent (reset)
        const frames = [...Array(2).fill([0.005, false]), ...Array(5).fill([0.05, true]), ...Array(3).fill([0, false]),
                        ...Array(4).fill([0.05, true]), ...Array(5).fill([0, false])];
        frames.forEach(([rms, voiced], i) => {
          run.push({ rms, voiced }, 1000 + 20 * (i + 1));
          seen.push([run.voicedMs, run.startedAt, run.voicedAt]);
        });
        return seen;
    }""")
    assert got[1] == [0, 1000, None]  # soft onset only
    assert got[6] == [100, 1000, 1040]  # voiced from frame 2, onset from frame 0
    assert got[13] == [180, 1000, 1040]  # the 60 ms gap did not end the run
    assert got[-1] == [0, None, None]  # 100 ms of silence did


def test_spoken_turn_shows_transcript_reply_audio_and_waterfall(launch, mock, question_wav) -> None:
    page = launch(question_wav)
    open_page(page, mock)
    assert page.input_value("#persona") == "assistant" and page.input_value("#voice") == "joe"
    page.click("#start")
    page.wait_for_selector("#conversation .msg.user", timeout=60_000)
    assert page.inner_text("#conversation .msg.user .body") == "what is the weather like today"
    page.wait_for_selector("#traces li.trace")
    page.wait_for_function("window.parleyStats.playedSamples >= 22050 * 1.4")
    s = stats(page)
    assert s["framesSent"] > 50 and s["voicedFramesSent"] >= 25  # ~1.8 s of speech in 20 ms frames
    assert s["audibleSamples"] >= 0.9 * 22050 * 1.5  # the 1.5 s sine reply came out non-silent
    assert 0.25 < s["maxPeak"] < 0.35  # mock sine amplitude 0.3
    assert "It is sunny with a light breeze." in page.inner_text("#conversation .msg.assistant")
    row = page.locator("#traces li.trace").first
    stages = row.locator(".stage").evaluate_all("els => els.map(e => [e.dataset.stage, e.classList.contains('over')])")
    assert stages == [["endpointing", False], ["asr", False], ["llm_ttft", False], ["phrase", False],
                      ["tts", True], ["send", False], ["voice_to_voice", False]]
    ear = float(s["micToEar"]["1"])
    assert ear > 0 and row.locator("[data-field=mic_to_ear]").inner_text() == f"{math.floor(ear + 0.5)} ms"  # JS Math.round
    assert "1453 ms" in row.locator("[data-field=voice_to_voice]").inner_text()
    assert "p50 1453 ms p95 1453 ms" in page.inner_text("#latency")
    ended = row.locator("[data-field=turn_end]").inner_text()  # how the turn ended, from the trace's turn field
    assert ended == "ended: the longest pause a turn holds ran out; its check was still out after 864 ms", ended
    decided = page.evaluate("""async () => (await import("./waterfall.js")).turnEnd({end: "complete", checks: [
        {silence_ms: 250.4, complete_prob: 0.13, decision: "wait", cost_ms: 70},
        {silence_ms: 612.0, complete_prob: 0.987, decision: "end", cost_ms: 64.8}]})""")
    assert decided == "ended: a check heard a finished turn; P(finished) 0.99 after 612 ms of silence (check 65 ms)", decided


def test_typed_turn_then_persona_switch_changes_voice_and_greets(launch, mock, silent_wav) -> None:
    page = launch(silent_wav)
    open_page(page, mock)
    page.fill("#text", "hello there")
    page.press("#text", "Enter")
    page.wait_for_function("document.querySelector('#conversation .msg.assistant')?.textContent.includes('You said: hello there.')")
    assert page.inner_text("#conversation .msg.user.typed .body") == "hello there"
    page.wait_for_selector("#traces li.trace")
    assert "client send→ear" in page.inner_text("#traces li.trace .headline")
    assert page.locator("#traces li.trace [data-field=turn_end]").count() == 0  # a typed turn has no end-of-turn
    page.select_option("#persona", "storyteller")
    page.wait_for_function("window.parleyStats.persona === 'storyteller'")
    page.wait_for_function("[...document.querySelectorAll('.msg.assistant')].some(m => m.textContent.includes('Hello there, traveller.'))")
    assert page.input_value("#voice") == "kal"


def test_barge_in_stops_playback_while_the_user_still_speaks_and_next_turn_proceeds(launch, tmp_path) -> None:
    """How soon after the speech began the reply stopped is measured on the page's clock, so it is bounded by the
    interruption's own length (the user hears the reply stop while still talking), not by a number of ms that a
    slower machine would miss; the stop's latency is printed."""
    interruption = "Stop, tell me something else instead."
    speech, rate = corpus.speak_piper(interruption)
    first_ms, last_ms = corpus.speech_bounds_ms(speech, rate)
    server = mock_server(tmp_path, json.dumps({"reply_s": 8.0}))
    server.start()
    try:
        wav = mic_wav(tmp_path / "barge.wav", [("silence", 500), ("say", QUESTION), ("silence", 1800),
                                                ("say", interruption), ("silence", 30000)])
        page = launch(wav)
        open_page(page, server)
        page.click("#start")
        page.wait_for_function("window.parleyStats.bargeIns.some(b => b.stopMs !== null)", timeout=60_000)
        page.wait_for_function("document.querySelectorAll('#conversation .msg.user').length >= 2", timeout=60_000)
        s = stats(page)
        barge = s["bargeIns"][0]
        print("barge-in", barge)
        assert barge["turnId"] == 1 and 0 < barge["stopMs"] < last_ms - first_ms, (barge, last_ms - first_ms)
        assert s["audibleSamples"] < 22050 * 6  # far less than the 8 s reply was played
        assert page.locator("#conversation .msg.assistant.interrupted").count() >= 1
        page.wait_for_function("window.parleyStats.firstPlayed['2'] !== undefined", timeout=60_000)
    finally:
        server.kill()


def test_greeting_is_shown_and_played_in_full_once_sound_is_allowed(launch, tmp_path, silent_wav) -> None:
    server = mock_server(tmp_path, json.dumps({"greeting": "Hi, I'm the mock."}))
    server.start()
    try:
        # Without the autoplay flag the browser may hold sound until a gesture (headless builds differ);
        # either way the greeting's audio is kept, not lost, and plays in full by the first click.
        page = launch(silent_wav, autoplay=False)
        open_page(page, server)
        page.wait_for_function("window.parleyStats.done.length === 1")
        page.click("#start")
        page.wait_for_function("window.parleyStats.turnAudio['1']?.playedS > 1.4 && window.parley.player.idle")
        assert "Hi, I'm the mock." in page.inner_text("#conversation .msg.assistant")
    finally:
        server.kill()


def test_a_short_blip_pauses_the_reply_but_does_not_end_it(launch, tmp_path) -> None:
    server = mock_server(tmp_path, json.dumps({"reply_s": 4.0}))
    server.start()
    try:
        # 30 ms (about 80 ms voiced after the browser's AGC) is under the mock's 100 ms and the client's 200 ms.
        wav = mic_wav(tmp_path / "blip.wav", [("silence", 500), ("say", QUESTION), ("silence", 2000), ("tone", 30),
                                               ("silence", 30000)])
        page = launch(wav)
        open_page(page, server)
        page.click("#start")
        page.wait_for_function("window.parleyStats.done.length >= 1 && window.parley.player.idle", timeout=60_000)
        s = stats(page)
        assert s["holds"] == 1 and s["releases"] == 1  # paused on the blip, then went on
        assert s["bargeIns"] == [] and s["done"][0]["interrupted"] is False
        assert s["turnAudio"]["1"]["playedS"] > 3.9  # the whole 4 s reply played, around the pause
        assert page.locator("#conversation .msg.assistant.interrupted").count() == 0
    finally:
        server.kill()


def test_server_restart_shows_error_then_reconnects_without_reload(launch, mock, silent_wav) -> None:
    page = launch(silent_wav)
    open_page(page, mock)
    restart_and_expect_reconnect(page, mock, reconnect_timeout_ms=60_000)
    page.fill("#text", "are you back")
    page.press("#text", "Enter")
    page.wait_for_function("document.body.textContent.includes('You said: are you back.')")


def test_full_server_is_explained(launch, tmp_path) -> None:
    server = mock_server(tmp_path, json.dumps({"max_sessions": 0}))
    server.start()
    try:
        page = launch()
        page.goto(server.url)
        page.wait_for_selector("#error:not([hidden])")
        assert "busy" in page.inner_text("#error") and page.get_attribute("#error", "data-kind") == "full"
        page.wait_for_selector("#conn[data-phase=waiting]")
    finally:
        server.kill()


def test_wrong_token_is_refused_and_not_retried(launch, tmp_path) -> None:
    server = mock_server(tmp_path, json.dumps({"token": "s3cret"}))
    server.start()
    try:
        page = launch()
        page.goto(server.url + "?token=wrong")
        page.wait_for_selector("#conn[data-phase=refused]")
        assert page.get_attribute("#error", "data-kind") == "auth" and "token" in page.inner_text("#error")
        # refused is final: no retry is scheduled (only the retry timer or a reload opens the socket again)
        conn = page.evaluate("({opens: window.parley.conn.opens, stopped: window.parley.conn.stopped, "
                             "timer: window.parley.conn.retryTimer, retryAt: window.parley.conn.retryAt})")
        assert conn == {"opens": 1, "stopped": True, "timer": None, "retryAt": None}, conn
        page.goto(server.url + "?token=s3cret")
        page.wait_for_selector("#conn[data-phase=up]")
    finally:
        server.kill()


def test_denied_microphone_is_explained_and_typing_still_works(launch, mock) -> None:
    page = launch(fake_ui=False)
    open_page(page, mock)
    page.click("#start")
    page.wait_for_selector("#error[data-kind=mic]:not([hidden])")
    assert "Microphone access was blocked" in page.inner_text("#error")
    assert page.is_enabled("#start")
    page.fill("#text", "typing instead")
    page.click("#send")
    page.wait_for_function("document.body.textContent.includes('You said: typing instead.')")


def test_phone_screen_fits_and_keyboard_reaches_every_control(launch, mock) -> None:
    page = launch(viewport={"width": 375, "height": 740})
    open_page(page, mock)
    page.wait_for_function("!document.querySelector('#send').disabled")  # enabled once the session is ready
    assert page.evaluate("document.documentElement.scrollWidth") <= 375
    for label in ("Persona", "Voice", "Link", "Type a message"):
        assert page.get_by_label(label).count() == 1
    order = []
    page.focus("body")
    for _ in range(8):
        page.keyboard.press("Tab")
        order.append(page.evaluate("document.activeElement.id"))
    assert order[:7] == ["past", "start", "persona", "voice", "transport", "text", "send"], order
    assert page.get_attribute("#partial", "aria-live") == "polite"
    assert page.get_attribute("#error", "role") == "alert"


def test_each_reply_reports_the_clients_own_playback_start(launch, mock, silent_wav) -> None:
    """From a reply's first audio message arriving to its first sample out: measured per reply on the page, shown in
    its trace row and sent to the server once, on the reply's first playback.mark (shape, not speed)."""
    page = launch(silent_wav)
    sent: list[dict] = []
    page.on("websocket", lambda ws: ws.on("framesent", lambda p: sent.append(json.loads(p)) if isinstance(p, str) else None))
    open_page(page, mock)
    for n, text in enumerate(("hello there", "and once more"), start=1):
        page.fill("#text", text)
        page.press("#text", "Enter")
        page.wait_for_function(f"window.parleyStats.done.length >= {n} && window.parley.player.idle")
    page.wait_for_function("document.querySelectorAll('#traces li.trace').length >= 2")
    s = stats(page)
    turns = sorted(s["playbackStart"], key=int)
    assert len(turns) >= 2, s["playbackStart"]
    for turn in turns:
        start = s["playbackStart"][turn]
        assert isinstance(start["startMs"], (int, float)) and math.isfinite(start["startMs"]) and start["startMs"] >= 0
        assert start["renderMs"] >= 0 and start["outputLatencyMs"] >= 0 and start["targetMs"] >= 0
        assert start["clock"] in ("output-timestamp", "estimate")
        assert isinstance(s["underruns"][turn], int) and s["underruns"][turn] >= 0
        firsts = [m for m in sent if m.get("type") == "playback.mark" and m["turn_id"] == int(turn) and "start_ms" in m]
        assert [m["start_ms"] for m in firsts] == [round(start["startMs"], 1)], firsts  # once, with the first mark
        assert firsts[0]["played_ms"] == 0 and firsts[0]["underruns"] == s["underruns"][turn]
        row = page.locator(f"#traces li.trace[data-turn='{turn}']")  # (the mock greets no one: every reply has a trace)
        assert row.locator("[data-field=client_playback]").inner_text() == f"{math.floor(start['startMs'] + 0.5)} ms"


def test_a_reply_that_runs_dry_counts_an_underrun_and_raises_the_jitter_target(launch, tmp_path, silent_wav) -> None:
    """The mock's speech stalls 600 ms after its first 200 ms (a TTS that fell behind): the reply runs dry part-way and
    goes on. That is an underrun (counted, sent on the marks), the next start waits for a larger jitter target, and
    every sample received is still played."""
    server = mock_server(tmp_path, json.dumps({"greeting": "Hi.", "reply_s": 1.0, "stall_after": 2, "stall_s": 0.6}))
    server.start()
    try:
        page = launch(silent_wav)
        sent: list[dict] = []
        page.on("websocket", lambda ws: ws.on("framesent", lambda p: sent.append(json.loads(p)) if isinstance(p, str) else None))
        open_page(page, server)
        wait_page(page, "window.parleyStats.done.length >= 1 && window.parley.player.idle", 60_000, server)  # the greeting
        page.fill("#text", "hello there")
        page.press("#text", "Enter")
        wait_page(page, "window.parleyStats.done.length >= 2 && window.parley.player.idle", 60_000, server)
        wait_page(page, "Object.keys(window.parleyStats.playbackStart).length >= 2", 60_000, server)
        s = stats(page)
    finally:
        server.kill()
    first, second = sorted(s["playbackStart"], key=int)[:2]
    assert s["underruns"][first] >= 1 and s["underruns"][second] >= 1, s["underruns"]
    assert s["playbackStart"][first]["targetMs"] == 0  # the first reply started at once
    assert s["playbackStart"][second]["targetMs"] >= 20  # the greeting's underrun raised the target
    for turn in (first, second):
        assert abs(s["turnAudio"][turn]["playedS"] - s["receivedS"][turn]) < 0.01  # nothing lost to the rebuffer
    marks = [m for m in sent if m.get("type") == "playback.mark" and m["turn_id"] == int(second)]
    assert max(m.get("underruns", 0) for m in marks) == s["underruns"][second]
