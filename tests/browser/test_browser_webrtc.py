"""The browser client over WebRTC against the real server (as `make run` starts it): headless Chromium with a
Piper-spoken fake microphone connects by WebRTC (the page's default), asks a spoken question and hears the
answer (the reply track as the page recorded it, transcribed back), and speech over a reply stops it."""
from __future__ import annotations

import base64
import io

import av
import numpy as np
import pytest

from bench import corpus as audio_corpus
from browser_harness import mic_wav, page_stats, wait_page
from parley.locate import find_embedded
from voice.asr import WhisperTranscriber
from voice.audio import resample

pytestmark = [pytest.mark.browser, pytest.mark.slow]

QUESTION = "What is the weather like today?"
STORY = "Tell me a long story about a brave knight and a dragon."
INTERRUPTION = "Wait, stop. What time is it?"
# Chromium hides host addresses behind mDNS names by default; the server here takes host candidates only
MDNS_OFF = ("--disable-features=WebRtcHideLocalIpsWithMdns",)


def recorded(page) -> np.ndarray:
    """What the page's MediaRecorder kept of the reply track (WebM/Opus), decoded to 16 kHz mono."""
    page.evaluate("window.parley.conn.recorder.requestData()")
    wait_page(page, "window.parley.conn.recorded.length > 0", 10_000)
    b64 = page.evaluate("""async () => {
        const blob = new Blob(window.parley.conn.recorded, {type: window.parley.conn.recorder.mimeType});
        const bytes = new Uint8Array(await blob.arrayBuffer());
        let s = ""; for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
        return btoa(s);
    }""")
    parts, rate = [], 48000
    with av.open(io.BytesIO(base64.b64decode(b64))) as container:
        for frame in container.decode(audio=0):
            rate = frame.sample_rate
            pcm = frame.to_ndarray()
            parts.append(pcm.mean(axis=0) if frame.format.is_planar else pcm.reshape(-1, len(frame.layout.channels)).mean(axis=1))
    audio = np.concatenate(parts).astype(np.float32)
    return resample(audio / 32768.0 if np.abs(audio).max() > 2 else audio, rate, 16000)


def test_webrtc_question_answer_heard_and_barge_in(server, launch, tmp_path) -> None:
    wav = mic_wav(tmp_path / "rtc.wav", [("silence", 600), ("say", QUESTION), ("silence", 9000), ("say", STORY),
                                          ("silence", 6500), ("say", INTERRUPTION), ("silence", 60_000)])  # fmt: skip
    page = launch(wav, transport="webrtc", extra_args=MDNS_OFF)
    page.goto(server.url)
    page.wait_for_selector("#conn[data-phase=up]", timeout=60_000)
    assert page_stats(page)["transport"] == "webrtc" and page.input_value("#transport") == "webrtc"
    wait_page(page, "window.parleyStats.done.length >= 1", 120_000, server)  # the greeting's text
    # its audio plays about a second behind: a question spoken over it would rightly cut it (CI heard "Hi, I'm
    # Parley. What" and the reply), so the microphone starts once the track is quiet
    wait_page(page, "performance.now() > window.parleyStats.done[0].at + 3000", 30_000)
    page.click("#start")
    user = page.locator("#conversation .msg.user").first
    user.wait_for(timeout=180_000)
    assert audio_corpus.wer(QUESTION, user.locator(".body").inner_text()) <= 0.25
    turn = int(user.get_attribute("data-turn"))
    wait_page(page, f"window.parleyStats.done.some(d => d.turnId === {turn})", 180_000, server)
    reply = page.locator(f"#conversation .msg.assistant[data-turn='{turn}'] .body").inner_text()
    # the reply plays about a second behind its last text (the server's audio lead); then the track is quiet
    wait_page(page, f"performance.now() > window.parleyStats.done.find(d => d.turnId === {turn}).at + 3000", 30_000)
    said = " ".join(page.locator("#conversation .msg.assistant .body").all_inner_texts())  # the greeting and the reply
    heard = WhisperTranscriber(find_embedded("asr")).transcribe(recorded(page)).text
    assert reply.strip() and audio_corpus.wer(said, heard) <= 0.35, (said, heard)
    # the story, then the interruption over it: the server stops the reply
    wait_page(page, "window.parleyStats.done.some(d => d.interrupted)", 180_000, server)
    s = page_stats(page)
    cut = next(d for d in s["done"] if d["interrupted"])
    assert cut["turnId"] > turn
    assert page.locator(f"#conversation .msg.assistant.interrupted[data-turn='{cut['turnId']}']").count() == 1


def test_a_server_without_webrtc_gets_the_socket(launch, mock) -> None:
    """The page's default is WebRTC; where the offer is not answered (here the mock server, which has only /ws)
    it falls back to the socket by itself and the conversation works there."""
    page = launch(transport="webrtc")
    page.goto(mock.url)
    page.wait_for_selector("#conn[data-phase=up]", timeout=30_000)
    assert page_stats(page)["transport"] == "ws" and page.input_value("#transport") == "ws"
    assert "offer" in page.evaluate("window.parley.conn.fallbackReason")
    page.fill("#text", "typing instead")
    page.click("#send")
    page.wait_for_function("document.body.textContent.includes('You said: typing instead.')")
