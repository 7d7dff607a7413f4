"""The server's echo canceller on real audio: a reply spoken by Piper, fed back into the microphone 60-120 ms later at
-10 dB (a speakerphone without an echo canceller), is taken out before the VAD hears it; the user's own speech over
it is not. The far end is placed only by playback marks, as a real client sends them."""
from __future__ import annotations

import numpy as np
import pytest

from bench import corpus
from voice.echo import ServerEcho
from voice.frontend import FrontEnd
from parley.locate import find_embedded
from voice.vad import SileroVad

pytestmark = pytest.mark.slow  # pywebrtc-audio is a dependency: no skip when it is missing, a failure

REPLY = "Sure. It will be sunny this afternoon with a light breeze, so it is a good day for a walk in the park."
MESSAGE = 320  # 20 ms messages, as the clients send


def voiced_share(audio: np.ndarray) -> float:
    vad = SileroVad(find_embedded("vad"))
    frame = int(16 * vad.frame_ms)
    probs = [vad.speech_prob(audio[i : i + frame]) for i in range(0, len(audio) - frame, frame)]
    return float(np.mean(np.asarray(probs) > 0.5))


def run(delay_ms: float, user: np.ndarray | None = None, user_at_ms: float = 2000.0, mark_skew_ms: float = 0.0):
    far = corpus.speak(REPLY, "piper")
    mic = np.zeros(len(far) + 16000, np.float32)
    d = int(16 * delay_ms)
    mic[d : d + len(far)] += far * 10 ** (-10 / 20)
    if user is not None:
        s = int(16 * user_at_ms)
        mic[s : s + len(user)] += user[: len(mic) - s]
    echo = ServerEcho()
    echo.sent(7, far)
    rng = np.random.default_rng(0)
    out = []
    for i in range(0, len(mic) - MESSAGE, MESSAGE):
        t_ms = i / 16.0
        if i % (MESSAGE * 12) == 0:  # a playback mark every 240 ms: what had played when this audio was captured,
            echo.played(7, max(0.0, t_ms - rng.uniform(0.0, mark_skew_ms)), t_ms)  # as late as the network makes it
        out.append(echo.process(mic[i : i + MESSAGE], t_ms))
    return mic, np.concatenate(out)


@pytest.mark.parametrize("delay_ms,skew_ms", [(60, 0), (120, 0), (90, 80), (120, 120)])
def test_the_replies_echo_is_taken_out_before_the_vad(delay_ms: float, skew_ms: float) -> None:
    mic, clean = run(delay_ms, mark_skew_ms=skew_ms)
    assert voiced_share(mic) > 0.6  # what the VAD heard before: the reply, as speech
    assert voiced_share(clean) < 0.05


def test_the_users_speech_over_the_echo_still_comes_through() -> None:
    user = corpus.speak("No, tell me about Mars instead.", "flite")
    alone = voiced_share(np.concatenate([np.zeros(32000, np.float32), user]))
    mic, clean = run(90, user)
    span = clean[32000 : 32000 + len(user)]
    assert voiced_share(span) >= 0.6 * alone  # most of the user's voiced frames survive
    after = clean[32000 + len(user) + 8000 :]
    assert voiced_share(after) < 0.05  # and the echo around it is still gone


def test_nothing_is_touched_while_no_reply_plays() -> None:
    audio = corpus.speak("What is the weather like today?", "espeak")
    echo = ServerEcho(make_aec=lambda: pytest.fail("no reply played: no echo canceller is needed"))
    out = np.concatenate([echo.process(audio[i : i + MESSAGE], i / 16.0) for i in range(0, len(audio), MESSAGE)])
    assert np.array_equal(out, audio[: len(out)]) and len(audio) - len(out) < 160


class RecordingAec:
    def __init__(self) -> None:
        self.far_rms: list[float] = []

    def process(self, near: np.ndarray, far: np.ndarray) -> np.ndarray:
        self.far_rms.append(float(np.sqrt(np.mean(far**2))))
        return near


def test_the_far_end_follows_the_clients_marks_pause_and_clear() -> None:
    aec = RecordingAec()
    echo = ServerEcho(make_aec=lambda: aec)
    echo.sent(3, np.full(16000 * 3, 0.1, np.float32))  # 3 s of reply audio
    mic = np.zeros(MESSAGE, np.float32)

    def step(n: int, t_ms: float) -> list[float]:
        aec.far_rms.clear()
        for k in range(n):
            echo.process(mic, t_ms + 20.0 * k)
        return aec.far_rms

    assert step(5, 0.0) == []  # nothing sent plays yet: the microphone passes untouched
    echo.played(3, 0.0, 100.0)
    assert all(r > 0.09 for r in step(10, 100.0))  # it plays from mic time 100 on
    echo.paused(3, 200.0)
    assert all(r == 0.0 for r in step(10, 300.0))  # paused (speech over it): no far end, the canceller stays warm
    echo.played(3, 200.0, 600.0)
    assert all(r > 0.09 for r in step(10, 600.0))
    echo.stop()  # cleared: nothing plays, and 1.5 s later the microphone passes untouched again
    assert all(r == 0.0 for r in step(10, 800.0)) and step(5, 2600.0) == []


def test_a_microphone_that_never_hears_the_reply_passes_the_users_words_untouched() -> None:
    # A headset: the reply plays, marks come, and the microphone has only the user on it. AEC3 alone would take a
    # "yeah" out whole (45 dB down) while it still looks for the echo path; no echo found, nothing is cancelled.
    far = corpus.speak(REPLY, "piper")
    user = corpus.speak("Yeah.", "piper-steady")
    rng = np.random.default_rng(1)
    mic = rng.normal(0.0, 1e-3, len(far) + 16000).astype(np.float32)  # a quiet room, and no loudspeaker in it
    s = 3 * 16000
    mic[s : s + len(user)] += user
    echo = ServerEcho()
    echo.sent(7, far)
    out = []
    for i in range(0, len(mic) - MESSAGE, MESSAGE):
        if i % (MESSAGE * 12) == 0:
            echo.played(7, i / 16.0, i / 16.0)
        out.append(echo.process(mic[i : i + MESSAGE], i / 16.0))
    clean = np.concatenate(out)
    assert np.array_equal(clean[s : s + len(user)], mic[s : s + len(user)])
    assert echo.presence.correlation is not None and echo.presence.correlation < 0.3


class MarkLog:
    """What a session tells its echo canceller about playback (voice.echo.ServerEcho's calls, recorded)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, float]] = []

    def sent(self, turn_id: int, audio: np.ndarray) -> None:
        pass

    def played(self, turn_id: int, played_ms: float, mic_ms: float) -> None:
        self.calls.append(("played", turn_id, played_ms))

    def paused(self, turn_id: int, played_ms: float) -> None:
        self.calls.append(("paused", turn_id, played_ms))

    def stop(self) -> None:
        self.calls.append(("stop", 0, 0.0))

    def process(self, samples: np.ndarray, t_ms: float) -> np.ndarray:
        return samples


async def test_a_reply_sent_whole_still_tells_the_canceller_where_it_plays_and_pauses() -> None:
    """A short reply is all sent long before the client has played it: the client's marks, and its pause for speech
    over the reply, must still move the far end, or the canceller lays the echo where it no longer is (its echo
    then holds the reply again and again). A stopped reply's late marks do not."""
    from fakes import Harness

    async with Harness() as h:
        log = MarkLog()
        h.session.listener.frontend = FrontEnd(echo=log)  # type: ignore[arg-type]
        h.session.text_input("hello")
        done = await h.wait_for("response.done")
        turn = done["turn_id"]
        assert h.session.replies.running(turn) is None  # sent whole: its task is over
        h.session.playback_mark(turn, 240.0, 0)
        h.session.playback_mark(turn, 300.0, 0, paused=True)
        h.session.playback_mark(turn, 300.0, 0)
        assert log.calls == [("played", turn, 240.0), ("paused", turn, 300.0), ("played", turn, 300.0)]
        h.session.text_input("and again")
        await h.wait_for("audio", 2)  # the second reply's audio
        second = h.of("audio")[-1]["turn_id"]
        h.session.cancel_reply()
        await h.wait_for("response.done", 2)
        log.calls.clear()
        h.session.playback_mark(second, 10.0, 0)  # a mark after its clear: nothing plays any more
        assert log.calls == []
