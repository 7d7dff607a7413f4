"""The WebRTC microphone under loss (web.webrtc_loss) and the reply track's clock (web.webrtc_pacing), on scripted
packets, frames and times: a lost packet costs 80 ms of waiting, not 300, and its 20 ms are filled, not cut."""
from __future__ import annotations

import asyncio
import fractions

import av
import numpy as np
import pytest
from aiortc.jitterbuffer import JitterBuffer
from aiortc.mediastreams import MediaStreamError
from aiortc.rtp import RtpPacket

from web.webrtc_loss import Concealer, SkippingJitterBuffer
from web.webrtc_media import FRAME_SAMPLES, OPUS_RATE, read_microphone
from web.webrtc_pacing import Pacer


def _packet(seq: int) -> RtpPacket:
    p = RtpPacket(payload_type=111, sequence_number=seq, timestamp=seq * FRAME_SAMPLES)
    p._data = bytes([seq % 256])  # type: ignore[attr-defined]  # what the receiver's depayloader sets
    return p


def _released(buffer: JitterBuffer, seqs: list[int]) -> list[tuple[int, int]]:
    """(arrival index, frame timestamp / 960) for each frame the buffer hands on."""
    out = []
    for i, seq in enumerate(seqs):
        _, frame = buffer.add(_packet(seq))
        if frame is not None:
            out.append((i, frame.timestamp // FRAME_SAMPLES))
    return out


def test_lossless_the_skipping_buffer_is_aiortcs() -> None:
    seqs = list(range(40))
    assert _released(SkippingJitterBuffer(16, 4), seqs) == _released(JitterBuffer(16, 4), seqs)


def test_a_lost_packet_is_given_up_after_the_prefetch_not_the_capacity() -> None:
    seqs = [s for s in range(60) if s not in (10, 31)]
    stock, ours = _released(JitterBuffer(16, 4), seqs), _released(SkippingJitterBuffer(16, 4), seqs)
    # aiortc's: nothing for 15 packets after the hole, and each frame 15 packets late from then on
    stock_delay = {ts: i - seqs.index(ts) for i, ts in stock}
    assert max(stock_delay.values()) >= 14
    delay = {ts: i - seqs.index(ts) for i, ts in ours}
    assert 10 not in delay and 31 not in delay  # lost
    assert max(delay.values()) == 4  # every frame handed on 4 packets after it arrived, around the holes too
    assert [ts for _, ts in ours] == seqs[: len(ours)]  # in order, none dropped but the lost
    assert len(ours) == len(seqs) - 4  # all but the 4 still prefetched


def test_a_burst_of_losses_is_skipped_whole() -> None:
    seqs = [s for s in range(40) if not 10 <= s < 14]
    ours = _released(SkippingJitterBuffer(16, 4), seqs)
    assert [ts for _, ts in ours] == seqs[: len(ours)]
    assert max(i - seqs.index(ts) for i, ts in ours) == 4


def _voice(n: int, rate: int = OPUS_RATE, hz: float = 180.0) -> np.ndarray:
    t = np.arange(n) / rate
    return (0.5 * np.sin(2 * np.pi * hz * t) + 0.2 * np.sin(2 * np.pi * 2 * hz * t)).astype(np.float32)


def test_a_lost_frame_is_filled_with_the_last_period_fading_and_the_timeline_kept() -> None:
    audio = _voice(20 * FRAME_SAMPLES)
    c = Concealer(OPUS_RATE)
    out = [c.push(k * FRAME_SAMPLES, audio[k * FRAME_SAMPLES : (k + 1) * FRAME_SAMPLES]) for k in range(20) if k != 8]
    heard = np.concatenate(out)
    assert len(heard) == len(audio)  # the lost 20 ms are there, not cut out
    assert c.concealed_samples == FRAME_SAMPLES
    hole = slice(8 * FRAME_SAMPLES, 9 * FRAME_SAMPLES)
    np.testing.assert_array_equal(heard[: hole.start], audio[: hole.start])
    np.testing.assert_array_equal(heard[hole.stop + 200 :], audio[hole.stop + 200 :])  # after the crossfade
    start = heard[hole.start : hole.start + 240]  # the first 5 ms: the voice continued, near full level
    assert np.corrcoef(start, audio[hole.start : hole.start + 240])[0, 1] > 0.95
    level = lambda x: float(np.sqrt(np.mean(x**2)))  # noqa: E731
    assert level(heard[hole][-240:]) < 0.8 * level(heard[hole][:240])  # fading
    assert np.max(np.abs(np.diff(heard))) < 4 * np.max(np.abs(np.diff(audio)))  # no click at either edge


def test_a_long_loss_fades_to_silence_and_a_duplicate_is_not_heard_twice() -> None:
    audio = _voice(30 * FRAME_SAMPLES)
    c = Concealer(OPUS_RATE)
    frames = [(k, audio[k * FRAME_SAMPLES : (k + 1) * FRAME_SAMPLES]) for k in range(30)]
    out = []
    for k, x in frames[:5] + frames[15:] + [frames[20]]:  # 200 ms lost, then frame 20 again
        out.append(c.push(k * FRAME_SAMPLES, x))
    heard = np.concatenate(out)
    assert len(heard) == len(audio)
    assert out[-1].size == 0
    silent_from = 5 * FRAME_SAMPLES + int(0.060 * OPUS_RATE)  # FADE_MS after the hole opened
    assert np.all(heard[silent_from : 15 * FRAME_SAMPLES] == 0)


def test_a_hole_before_any_audio_is_silence_and_a_new_timeline_is_not_filled() -> None:
    c = Concealer(16000)
    assert np.all(c.push(320, np.ones(320, np.float32)) == 1)  # the first frame: nothing to fill
    c = Concealer(16000)
    c._next_pts = 0
    out = c.push(320, np.ones(320, np.float32))
    assert len(out) == 640 and np.all(out[:320] == 0)
    assert len(c.push(10 * 16000, np.ones(320, np.float32))) == 320  # 10 s ahead: a new source, no 10 s of fill


class _Track:
    """What read_microphone uses of aiortc's remote track: decoded 48 kHz stereo s16 frames with RTP pts."""

    def __init__(self, frames: list[av.AudioFrame]) -> None:
        self.frames = frames

    async def recv(self) -> av.AudioFrame:
        if not self.frames:
            raise MediaStreamError
        return self.frames.pop(0)


def test_the_microphone_keeps_the_callers_timeline_through_lost_packets() -> None:
    audio = (_voice(50 * FRAME_SAMPLES) * 32767).astype(np.int16)
    frames = []
    for k in range(50):
        if k in (7, 21, 22, 40):
            continue
        pcm = audio[k * FRAME_SAMPLES : (k + 1) * FRAME_SAMPLES]
        f = av.AudioFrame.from_ndarray(np.repeat(pcm, 2).reshape(1, -1), format="s16", layout="stereo")
        f.sample_rate, f.pts, f.time_base = OPUS_RATE, k * FRAME_SAMPLES, fractions.Fraction(1, OPUS_RATE)
        frames.append(f)
    heard: list[tuple[np.ndarray, int]] = []
    asyncio.run(read_microphone(_Track(frames), lambda samples, rate: heard.append((samples, rate))))  # type: ignore[arg-type]
    assert {rate for _, rate in heard} == {OPUS_RATE}  # the track's own rate: the session's front end resamples
    assert sum(len(h) for h, _ in heard) == 50 * FRAME_SAMPLES  # all 50 frames' time, to the sample;
    # without concealment the 4 lost frames would be missing


def test_the_pacer_keeps_a_steady_clock_and_runs_a_reply_ahead_by_its_lead() -> None:
    p = Pacer(0.02, lead_s=0.1)
    assert p.due_s(100.0, audio=False) == 100.0
    assert p.due_s(100.0, audio=False) == pytest.approx(100.02)  # silence keeps to the clock
    # a reply starts at 100.04: its first frames go at once, until it runs 100 ms ahead
    dues = [p.due_s(100.04, audio=True) for _ in range(8)]
    assert dues[0] == pytest.approx(99.94)
    assert [d <= 100.04 for d in dues] == [True] * 6 + [False] * 2
    assert p.ahead_s(100.04) == pytest.approx(0.16)  # 10 frames (200 ms) handed on by 100.04: 160 ms of them ahead
    # the loop is 300 ms late: it catches up (frames due in the past go at once), it does not shift the clock
    late = p.due_s(100.5, audio=True)
    assert late == pytest.approx(100.0 + 10 * 0.02 - 0.1)
    # silence after the reply waits for the clock: the lead is given back
    assert p.due_s(100.5, audio=False) == pytest.approx(100.22)


def test_an_answering_peer_connections_audio_receiver_gets_the_skipping_buffer() -> None:
    """The hook into aiortc's receiver (a private attribute, aiortc pinned) still finds its JitterBuffer."""
    from aiortc import RTCConfiguration, RTCPeerConnection

    from web.webrtc_loss import JITTER_BUFFER_ATTR, skip_lost_packets

    async def go() -> tuple[int, int, object]:
        caller, answerer = (RTCPeerConnection(RTCConfiguration(iceServers=[])) for _ in range(2))  # no STUN
        try:
            caller.addTransceiver("audio", direction="sendrecv")
            await caller.setLocalDescription(await caller.createOffer())
            await answerer.setRemoteDescription(caller.localDescription)
            first, again = skip_lost_packets(answerer), skip_lost_packets(answerer)
            receiver = answerer.getTransceivers()[0].receiver
            return first, again, getattr(receiver, JITTER_BUFFER_ATTR)
        finally:
            await caller.close()
            await answerer.close()

    first, again, buffer = asyncio.run(go())
    assert (first, again) == (1, 0) and isinstance(buffer, SkippingJitterBuffer)
    assert (buffer.capacity, buffer._prefetch) == (16, 4)  # aiortc's own sizes kept
