"""voice.codec against reference tables built here from G.711's definition (segments of 16 steps, each step's
decision interval and its reconstruction at the interval's middle), written independently of the module's bit
arithmetic: every one of the 65,536 PCM16 values is encoded, every one of the 256 codes decoded."""
from __future__ import annotations

import numpy as np
import pytest

from voice import codec
from voice.audio import SAMPLE_RATE

ALL_PCM16 = np.arange(-32768, 32768, dtype=np.int32)


def ulaw_reference() -> tuple[dict[int, int], list[int]]:
    """-> (14-bit magnitude -> 7-bit segment/step, code -> PCM16 value).

    μ-law, 14-bit magnitudes biased by 33: segment s (0..7) spans [2^(s+5), 2^(s+6)) in 16 steps of 2^(s+1);
    each step reconstructs at its middle. Codes are sent inverted (all bits) after a sign bit set for negative
    values, so on the line positive values have the top bit set; magnitudes past the last step are coded as it."""
    step_of: dict[int, int] = {}
    value_of: list[int] = [0] * 256
    for s in range(8):
        for m in range(16):
            width = 2 ** (s + 1)
            lo = 2 ** (s + 5) + m * width - 33  # magnitude where the step starts
            for mag in range(max(lo, 0), lo + width):
                if mag <= 8158:
                    step_of[mag] = s * 16 + m
            middle = lo + width // 2  # step 0 holds magnitude 0 only (its lower half is below zero)
            for negative in (False, True):
                code = ~((0x80 if negative else 0) | (s * 16 + m)) & 0xFF
                value = middle * 4
                value_of[code] = -value if negative else value
    return step_of, value_of


def ulaw_encode_reference(x: int, step_of: dict[int, int]) -> int:
    v = x >> 2  # 16-bit to 14-bit, as G.711 implementations take the top 14 bits
    negative = v < 0
    step = step_of[min(-v if negative else v, 8158)]
    return ~((0x80 if negative else 0) | step) & 0xFF


def alaw_reference() -> tuple[dict[int, int], list[int]]:
    """A-law, 13-bit magnitudes (negative values one's-complemented): segment 0 is 16 steps of 2 from 0,
    segment s>=1 16 steps of 2^s from 2^(s+4); each step reconstructs at its middle. The sign bit is set for
    positive values and the even bits are inverted (XOR 0x55) on the line."""
    step_of: dict[int, int] = {}
    value_of: list[int] = [0] * 256
    for s in range(8):
        width = 2 if s == 0 else 2**s
        start = 0 if s == 0 else 2 ** (s + 4)
        for m in range(16):
            lo = start + m * width
            for mag in range(lo, lo + width):
                step_of[mag] = s * 16 + m
            middle = lo + width / 2
            for positive in (True, False):
                code = ((0x80 if positive else 0) | (s * 16 + m)) ^ 0x55
                value = int(middle * 8)
                value_of[code] = value if positive else -value
    return step_of, value_of


def alaw_encode_reference(x: int, step_of: dict[int, int]) -> int:
    v = x >> 3
    positive = v >= 0
    step = step_of[v if positive else -v - 1]
    return ((0x80 if positive else 0) | step) ^ 0x55


def test_ulaw_matches_the_reference_for_every_code_and_every_sample() -> None:
    step_of, value_of = ulaw_reference()
    assert codec.ulaw_decode(bytes(range(256))).tolist() == value_of
    expected = bytes(ulaw_encode_reference(int(x), step_of) for x in ALL_PCM16)
    assert codec.ulaw_encode(ALL_PCM16.astype(np.int16)) == expected
    assert codec.ulaw_encode(np.zeros(1, np.int16)) == b"\xff"  # μ-law silence on a phone line


def test_alaw_matches_the_reference_for_every_code_and_every_sample() -> None:
    step_of, value_of = alaw_reference()
    assert codec.alaw_decode(bytes(range(256))).tolist() == value_of
    expected = bytes(alaw_encode_reference(int(x), step_of) for x in ALL_PCM16)
    assert codec.alaw_encode(ALL_PCM16.astype(np.int16)) == expected
    assert codec.alaw_encode(np.zeros(1, np.int16)) == b"\xd5"  # A-law silence


@pytest.mark.parametrize("law", ["pcmu", "pcma"])
def test_codes_round_trip_and_samples_stay_within_a_step(law: codec.Law) -> None:
    enc, dec = (codec.ulaw_encode, codec.ulaw_decode) if law == "pcmu" else (codec.alaw_encode, codec.alaw_decode)
    codes = bytes(range(256))
    assert enc(dec(codes)) == codes or law == "pcmu" and _ulaw_zeros_merge(enc(dec(codes)), codes)
    decoded = dec(enc(ALL_PCM16.astype(np.int16))).astype(np.int32)
    # the error is at most half the widest step (segment 7: 1024 for μ-law, 1024 for A-law on the 16-bit scale)
    # plus the bits dropped going to 14/13 bits; near zero it is a few units
    error = np.abs(decoded - ALL_PCM16)
    assert error.max() <= 1024 + 8
    assert error[np.abs(ALL_PCM16) < 64].max() <= 8
    assert enc(ALL_PCM16.astype(np.int16).tobytes()) == enc(ALL_PCM16.astype(np.int16))  # bytes in, same codes


def _ulaw_zeros_merge(got: bytes, codes: bytes) -> bool:
    """μ-law has two zeros (0xFF and 0x7F): both decode to 0, which encodes as 0xFF."""
    diff = [i for i in range(256) if got[i] != codes[i]]
    return diff == [0x7F] and got[0x7F] == 0xFF


def test_float_helpers_and_streaming_resampler() -> None:
    t = np.arange(SAMPLE_RATE) / SAMPLE_RATE
    tone16 = (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    down, up = codec.Resampler(SAMPLE_RATE, codec.G711_RATE), codec.Resampler(codec.G711_RATE, SAMPLE_RATE)
    chunks = [down.push(tone16[i : i + 320]) for i in range(0, len(tone16), 320)] + [down.push(np.zeros(0, np.float32), last=True)]
    narrow = np.concatenate(chunks)
    assert abs(len(narrow) - codec.G711_RATE) <= 1
    for law in ("pcmu", "pcma"):
        data = codec.encode(law, narrow)
        assert len(data) == len(narrow)
        back = codec.decode(law, data)
        snr_db = 10 * np.log10(np.sum(narrow**2) / np.sum((back - narrow) ** 2))
        assert snr_db > 30, snr_db  # G.711 on a loud tone: ~38 dB
    wide = np.concatenate([up.push(narrow[i : i + 160]) for i in range(0, len(narrow), 160)] + [up.push(np.zeros(0, np.float32), last=True)])
    assert abs(len(wide) - SAMPLE_RATE) <= 2
    # streamed chunk by chunk, the 440 Hz tone comes back whole: no clicks at the chunk boundaries
    spectrum = np.abs(np.fft.rfft(wide[1000:15000]))
    assert np.argmax(spectrum) * SAMPLE_RATE / 14000 == pytest.approx(440, abs=2)
    core = wide[1000:15000]
    assert np.max(np.abs(np.diff(core))) < 2 * np.pi * 440 / SAMPLE_RATE * 0.5 * 1.2


def test_odd_pcm16_bytes_are_refused() -> None:
    with pytest.raises(ValueError, match="even number"):
        codec.ulaw_encode(b"\x00\x01\x02")
