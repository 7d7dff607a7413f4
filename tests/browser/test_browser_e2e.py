"""The browser client against the real server, started as `make run` starts it, with real models.

Headless Debian chromium, fake microphone from Piper-spoken WAVs. Asserts what a person would notice:
their words as the transcript, a reply they can hear, a latency row, barge-in, persona. The one bound on time is the
barge-in's: playback stops while the user is still speaking (on the page's own clock). How the page reconnects after
the server restarts is the mock's test (test_browser_mock.py, the same page over real sockets); a restart of the real
server under a connected client is tests/client/test_client_real_server.py's.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from bench import corpus as audio_corpus
from parley.config import load_config
from bench.parley_process import ParleyProcess
from browser_harness import ROOT, mic_wav, page_stats, wait_page

pytestmark = [pytest.mark.browser, pytest.mark.slow]

QUESTION = "What is the weather like today?"
STORY = "Tell me a long story about a brave knight and a dragon."
INTERRUPTION = "Wait, stop. What time is it?"
BACKCHANNEL = "Yeah."
BACKCHANNEL_GAP_MS = 2500.0  # after the "yeah", before the interruption: the reply resumed and plays on
STAGES = ["endpointing", "asr", "llm_ttft", "phrase", "tts", "send", "voice_to_voice"]
OUT_RATE_FALLBACK = 22050
measured: dict[str, float] = {}  # mic-to-ear of the first spoken turn, to place the barge-in speech


stats = page_stats


def open_after_greeting(page, server: ParleyProcess) -> dict:
    """Open the page and let the session's spoken greeting finish, so the mic starts into silence."""
    page.goto(server.url)
    page.wait_for_selector("#conn[data-phase=up]", timeout=60_000)
    page.wait_for_function("window.parleyStats.done.length >= 1 && Object.keys(window.parleyStats.turnAudio).length >= 1"
                           " && window.parley.player.idle", timeout=120_000)
    return stats(page)


def wait_turn_played(page, turn_id: int) -> None:
    page.wait_for_function(f"window.parleyStats.done.some(d => d.turnId === {turn_id}) && window.parley.player.idle",
                           timeout=180_000)


def wait_heard_in_full(page, turn_id: int, server: ParleyProcess) -> None:
    """Wait until every sample of a finished turn the page received has been played."""
    wait_page(page, f"window.parleyStats.done.some(d => d.turnId === {turn_id})"
                    f" && window.parleyStats.turnAudio['{turn_id}']?.playedS >="
                    f" (window.parleyStats.receivedS['{turn_id}'] ?? Infinity) - 0.005", 60_000, server)


def test_spoken_question_is_transcribed_answered_heard_and_traced(server, launch, tmp_path, artifacts) -> None:
    wav = mic_wav(tmp_path / "question.wav", [("silence", 600), ("say", QUESTION), ("silence", 60_000)])
    page = launch(wav)
    before = open_after_greeting(page, server)
    page.click("#start")
    user = page.locator("#conversation .msg.user").first
    user.wait_for(timeout=180_000)
    heard = user.locator(".body").inner_text()
    assert audio_corpus.wer(QUESTION, heard) <= 0.25, heard
    turn_id = int(user.get_attribute("data-turn"))
    row = page.locator(f"#traces li.trace[data-turn='{turn_id}']")
    row.wait_for(timeout=180_000)
    wait_turn_played(page, turn_id)
    reply = page.locator(f"#conversation .msg.assistant[data-turn='{turn_id}'] .body").inner_text()
    assert len(reply.split()) >= 3, reply
    s = stats(page)
    rate = s["outputRate"] or OUT_RATE_FALLBACK
    audible_s = (s["audibleSamples"] - before["audibleSamples"]) / rate
    assert audible_s >= 0.5 * len(reply.split()) * 0.25, (audible_s, reply)  # >= half of ~4 words/s speech
    assert s["maxPeak"] > 0.05  # the worklet's output was speech, not near-silence
    stages = row.locator(".stage").evaluate_all("els => els.map(e => e.dataset.stage)")
    assert stages == STAGES
    for stage in STAGES:
        value = row.locator(f".stage[data-stage='{stage}']").get_attribute("data-ms")
        assert value is not None and value != "undefined", stage
    ear = s["micToEar"][str(turn_id)]
    v2v, endpointing = stage_ms(page, turn_id, "voice_to_voice"), stage_ms(page, turn_id, "endpointing")
    assert ear > 0 and v2v is not None and v2v > 0 and endpointing is not None
    measured["mic_to_ear_ms"], measured["endpointing_ms"] = ear, endpointing
    ended = page.locator(f"#traces li.trace[data-turn='{turn_id}'] [data-field=turn_end]").inner_text()
    assert ended.startswith("ended: "), ended  # the server's turn field, as the page words it
    print(f"\nturn {turn_id}: server voice_to_voice {v2v:.0f} ms, client mic-to-ear {ear:.0f} ms, heard {heard!r}")
    shot = artifacts / "parley-turn.png"
    bottom = page.evaluate("Math.ceil(document.querySelector('main').getBoundingClientRect().bottom)")
    page.screenshot(path=str(shot), clip={"x": 0, "y": 0, "width": 1280, "height": min(900, bottom + 8)})
    if os.environ.get("PARLEY_UPDATE_SCREENSHOT"):
        shutil.copyfile(shot, ROOT / "docs" / "screenshot.png")


def barge_in_attempt(launch, server: ParleyProcess, wav: Path) -> tuple[object, dict | None]:
    """One fresh session that asks for a story, says "yeah" over its reply and then interrupts it: (page, the
    measured barge-in or None).

    Ends when the page stopped a reply for the speech, or when the interruption's own turn was answered
    without anything to stop (it landed before the reply was heard or in a gap between its phrases).
    """
    page = launch(wav)
    open_after_greeting(page, server)
    page.click("#start")
    wait_page(page, "window.parleyStats.bargeIns.some(b => b.stopMs !== null)"
                    " || [...document.querySelectorAll('#conversation .msg.user')].some(m => /time/i.test(m.innerText)"
                    " && window.parleyStats.done.some(d => d.turnId === +m.dataset.turn))", 180_000, server)
    barge = next((b for b in stats(page)["bargeIns"] if b["stopMs"] is not None), None)
    return page, barge


def stage_ms(page, turn_id: str | int, stage: str) -> float | None:
    """A stage's time from the page's latency row of that turn, None before its trace came."""
    cell = page.locator(f"#traces li.trace[data-turn='{turn_id}'] .stage[data-stage='{stage}']")
    value = cell.get_attribute("data-ms") if cell.count() else None
    return float(value) if value not in (None, "undefined") else None


def test_barge_in_stops_playback_while_the_user_still_speaks_and_next_turn_proceeds(server, launch, tmp_path) -> None:
    # The interruption starts a little into the reply: the story's mic-to-ear plus an offset, each try in a
    # fresh session (a reply cut short in one does not shape the next one's replies). Mic-to-ear is measured:
    # the first test's (or a conservative guess when run alone), then the story's own in the try before.
    # Speech within the rejoin window of the endpoint continues the request instead of interrupting it, so
    # the interruption never starts before that window is over. A slow machine leaves gaps between phrases,
    # and speech in a gap has nothing to stop: that try is a miss, and the next one lands elsewhere.
    rejoin_ms = load_config().vad.rejoin_window_ms
    ear, endpointing = measured.get("mic_to_ear_ms", 4500.0), measured.get("endpointing_ms", 1000.0)
    misses: list[dict] = []
    for attempt, into_reply_ms in enumerate((300.0, 150.0, 500.0, 900.0)):
        pause_ms = max(ear + into_reply_ms, endpointing + rejoin_ms + 300.0)
        wav = mic_wav(tmp_path / f"barge{attempt}.wav",
                      [("silence", 600), ("say", STORY), ("silence", pause_ms), ("say", BACKCHANNEL),
                       ("silence", BACKCHANNEL_GAP_MS), ("say", INTERRUPTION), ("silence", 60_000)])  # fmt: skip
        page, barge = barge_in_attempt(launch, server, wav)
        if barge is not None and any(r["turnId"] == barge["turnId"] for r in stats(page)["resumes"]):
            break  # the "yeah" landed on the reply (held, then resumed) and so did the interruption
        s = stats(page)
        story_turn = page.locator("#conversation .msg.user").first.get_attribute("data-turn")
        story_ear, story_endpointing = s["micToEar"].get(story_turn), stage_ms(page, story_turn, "endpointing")
        misses.append({"pause_ms": pause_ms, "story_mic_to_ear_ms": story_ear, "story_endpointing_ms": story_endpointing,
                       "story_reply_received_s": s["receivedS"].get(story_turn), "done": s["done"]})
        ear, endpointing = story_ear or ear + 800.0, story_endpointing or endpointing
        page.context.browser.close()
    else:
        raise AssertionError(f"no interruption landed while a reply was heard: {misses}")
    print(f"\nbarge-in: {barge} (after {len(misses)} missed attempts: {misses})")
    s = stats(page)
    # "Yeah." over the reply held it and the server resumed it: it played on, and no turn was opened for it
    resumed = next(r for r in s["resumes"] if r["turnId"] == barge["turnId"])
    # (the reason may be "none" or "unsure" too: what Whisper made of this take of the word; it played on either way)
    assert resumed["reason"] != "echo" and resumed["at"] < barge["decidedAt"], (resumed, barge)
    assert not [m for m in page.locator("#conversation .msg.user").all_inner_texts() if "yeah" in m.lower()]
    # the reply stopped while the user was still speaking (the page's clock; the stop's own latency is printed above)
    speech, rate = audio_corpus.speak_piper(INTERRUPTION)
    first_ms, last_ms = audio_corpus.speech_bounds_ms(speech, rate)
    assert barge["speechAt"] is not None and 0 < barge["stopMs"] < last_ms - first_ms, (barge, last_ms - first_ms)
    cut = barge["turnId"]
    assert str(cut) in s["firstPlayed"]  # it was really playing when the user spoke
    # The server may have finished sending before the cut; the page marks what the user cut off.
    assert page.locator(f"#conversation .msg.assistant.interrupted[data-turn='{cut}']").count() == 1
    # The interruption is the next turn: transcribed, answered and heard.
    wait_page(page, f"[...document.querySelectorAll('#conversation .msg.user')].some(m => +m.dataset.turn > {cut})",
              180_000, server)
    nxt = page.locator("#conversation .msg.user").filter(has_text="time").last
    assert audio_corpus.wer(INTERRUPTION, nxt.locator(".body").inner_text()) <= 0.4
    next_turn = int(nxt.get_attribute("data-turn"))
    assert next_turn > cut
    wait_page(page, f"window.parleyStats.firstPlayed['{next_turn}'] !== undefined", 180_000, server)


def test_persona_switch_changes_voice_and_greeting(server, launch, silent_wav) -> None:
    page = launch(silent_wav)
    open_after_greeting(page, server)
    first = page.locator("#conversation .msg.assistant").first.inner_text()
    assert "Hi, I'm Parley" in first
    page.select_option("#persona", "storyteller")
    page.wait_for_function("window.parleyStats.persona === 'storyteller' || document.querySelector('#voice').value === 'kal'")
    assert page.input_value("#voice") == "kal"
    # The server greets as the new persona at once, in the new voice, without a reload.
    page.wait_for_function("window.parleyStats.done.length >= 2", timeout=180_000)
    wait_page(page, "[...document.querySelectorAll('#conversation .msg.assistant')]"
                    ".some(m => m.innerText.includes('Hello there, traveller'))", 60_000, server)
    s = stats(page)
    joe_turn, kal_turn = s["done"][0]["turnId"], s["done"][1]["turnId"]
    # Compare whole turns: over its first few tenths of a second a reply that opens on a fricative
    # has as large a share above 5.5 kHz in flite's kal (resampled) as in Piper's joe.
    wait_heard_in_full(page, joe_turn, server)
    wait_heard_in_full(page, kal_turn, server)
    # The next reply keeps the storyteller's voice.
    page.fill("#text", "Say hello.")
    page.press("#text", "Enter")
    page.wait_for_function("window.parleyStats.done.length >= 3", timeout=180_000)
    reply_turn = stats(page)["done"][-1]["turnId"]
    wait_heard_in_full(page, reply_turn, server)
    s = stats(page)
    joe, kal, reply = (s["turnAudio"][str(t)] for t in (joe_turn, kal_turn, reply_turn))
    print(f"\nenergy above 5.5 kHz: joe greeting {joe}, kal greeting {kal}, kal reply {reply}")
    assert min(joe["playedS"], kal["playedS"], reply["playedS"]) > 0.3, (joe, kal, reply)
    # Piper joe is wideband; flite kal is 8 kHz speech: the played audio itself changed voice.
    assert kal["hfRatio"] < 0.5 * joe["hfRatio"], (joe, kal)
    assert reply["hfRatio"] < 0.5 * joe["hfRatio"], (joe, reply)
    # A new session with the remembered persona greets as the storyteller.
    page.reload()
    page.wait_for_function("window.parleyStats.done.length >= 1", timeout=120_000)
    assert page.input_value("#persona") == "storyteller" and page.input_value("#voice") == "kal"
    assert "Hello there, traveller" in page.locator("#conversation .msg.assistant").first.inner_text()


def test_a_dropped_page_resumes_and_the_conversation_is_read_back_and_deleted(server, launch, silent_wav, artifacts) -> None:
    page = launch(silent_wav)
    open_after_greeting(page, server)
    sid = page.evaluate("window.parley.conn.ready.session_id")
    # the link drops (any close but 1000): the page reconnects by itself with its token and says the conversation went on
    page.evaluate("window.parley.conn.ws.close(4000, 'network gone')")
    page.wait_for_function("document.querySelector('#conn').textContent.includes('resumed')", timeout=60_000)
    assert page.evaluate("window.parleyStats.connections.map(c => [c.sessionId, c.resumed])") == [[sid, False], [sid, True]]
    page.fill("#text", "Say hello.")
    page.press("#text", "Enter")
    page.wait_for_function("window.parleyStats.done.length >= 2", timeout=180_000)
    reply = page.locator("#conversation .msg.assistant .body").last.inner_text()
    assert page.locator("#conversation .msg.assistant").count() == 2  # the greeting once, then the reply
    page.evaluate("window.parley.conn.stop()")  # closed on purpose: the conversation ends, its transcript is kept
    page.click("header a[href='conversations.html']")
    item = page.locator(f"#conversations li[data-id='{sid}']")
    item.wait_for(timeout=30_000)
    assert item.locator("button.secondary").inner_text() == "Say hello."
    item.locator("button.secondary").click()
    said = page.locator("#transcript .msg")
    said.nth(2).wait_for(timeout=30_000)
    assert said.nth(1).inner_text() == "Say hello." and said.nth(2).inner_text() == reply.strip()
    assert "Hi, I'm Parley" in said.nth(0).inner_text()
    page.screenshot(path=str(artifacts / "parley-conversations.png"))
    item.locator("button.delete").click()
    assert item.locator("button.delete").inner_text() == "Delete for good?"  # one stray click loses nothing
    item.locator("button.delete").click()
    item.wait_for(state="detached", timeout=30_000)
    assert page.locator("#transcript .msg").count() == 0 and page.locator("#error").is_hidden()
