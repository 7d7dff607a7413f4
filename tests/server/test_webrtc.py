"""WebRTC against the real server (embedded models) with an aiortc client, no browser: the offer is answered with
host candidates only, the greeting and the answer to a spoken question come back on the Opus reply track (and
are transcribed back to the words the server says it spoke), the /ws messages come on the data channel, and
speech over a reply clears it; a wrong token or Origin gets no answer."""
from __future__ import annotations

import time

import pytest

from bench import corpus
from server_config import TOKEN
from webrtc_client import RtcClient

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

STORY = "Tell me a long story about a brave knight who fights a dragon in the mountains."
INTERRUPTION = "Wait, stop please, I have another question."


def speech(text: str):
    audio, rate = corpus.speak_piper(text, deterministic=True)
    return corpus.to_16k(audio, rate)


async def test_a_spoken_question_and_a_barge_in_over_webrtc(live_server) -> None:
    transcribe = live_server.runtime.stages.transcriber.transcribe
    async with RtcClient(http=live_server.http, token=TOKEN) as c:
        assert c.answer["status"] == 200, c.answer
        candidates = [line for line in c.answer["sdp"].splitlines() if line.startswith("a=candidate")]
        assert candidates and all(" typ host" in line for line in candidates)  # no STUN: nothing reflexive
        ready = await c.start()
        assert ready["session_id"] == c.answer["session_id"]
        greeting = await c.wait_for("response.done")
        await c.quiet_for(0.5, greeting["at_s"])
        greeted = transcribe(c.audio_since(0)).text
        assert corpus.wer(greeting["text"], greeted) <= 0.3, (greeting["text"], greeted)

        question = corpus.REQUESTS[0]
        asked_s = time.monotonic()
        c.mic.say(speech(question))
        final = await c.wait_for("transcript.final")
        assert corpus.wer(question, final["text"]) <= 0.2, final["text"]
        done = await c.wait_for("response.done", turn_id=final["turn_id"])
        await c.quiet_for(0.5, done["at_s"])
        answered = transcribe(c.audio_since(asked_s)).text
        assert corpus.wer(done["text"], answered) <= 0.3, (done["text"], answered)
        trace = await c.wait_for("turn.trace", turn_id=final["turn_id"])
        assert trace["stages_ms"]["voice_to_voice"] > 0  # the server's own playback marks timed it

        # typed over the data channel, interrupted by voice on the track
        await c.send(type="input.text", text=STORY)
        story = final["turn_id"] + 1
        started = await c.wait_for("response.text.delta", turn_id=story)
        await c.sound_after(started["at_s"])  # the story is being heard
        c.mic.say(speech(INTERRUPTION))
        clear = await c.wait_for("response.audio.clear")
        cut = await c.wait_for("response.done", turn_id=story)
        assert clear["turn_id"] == story and cut["interrupted"]
        assert len(cut["spoken_text"].split()) < len(cut["text"].split())
        session = live_server.state.sessions[ready["session_id"]]
        kept = [t for r, t in session.history if r == "assistant"][-1]  # what the reply track played of it
        words = cut["text"].split()
        assert 0 < len(kept.split()) < len(words) and kept.split() == words[: len(kept.split())], (kept, cut)


async def test_a_wrong_token_or_origin_gets_no_answer(live_server) -> None:
    async with RtcClient(http=live_server.http, token="wrong") as c:
        assert c.answer["status"] == 401
    async with RtcClient(http=live_server.http, token=TOKEN, origin="http://evil.example") as c:
        assert c.answer["status"] == 403 and c.answer["code"] == "forbidden_origin"
    assert live_server.state.connections == 0
