"""TTS backends: Piper streaming, rate, cancellation; flite/espeak-ng fallback; Coqui's missing-package error."""
from __future__ import annotations

import importlib.util
import io
import wave

import numpy as np
import pytest

from bench import corpus
from voice.tts import CommandTts, CoquiTts, PiperTts, _parse_wav

TEXT = "Sure. It is sunny today. Take a walk in the park."


@pytest.mark.slow
def test_piper_streams_short_float_chunks_at_its_rate(piper_tts: PiperTts):
    assert piper_tts.sample_rate == 22050
    chunks = list(piper_tts.synthesize(TEXT))
    assert len(chunks) >= 6  # three sentences, 200 ms slices
    assert all(c.dtype == np.float32 and c.ndim == 1 and len(c) <= 4410 for c in chunks)
    audio = np.concatenate(chunks)
    assert 2.0 < len(audio) / 22050 < 6.0 and np.abs(audio).max() <= 1.0


@pytest.mark.slow
def test_piper_rate_changes_duration(piper_tts: PiperTts):
    def seconds(rate: float) -> float:
        return sum(len(c) for c in piper_tts.synthesize(TEXT, rate=rate)) / piper_tts.sample_rate

    normal, fast, slow = seconds(1.0), seconds(1.5), seconds(0.75)
    assert fast < 0.85 * normal and slow > 1.15 * normal
    with pytest.raises(ValueError):
        list(piper_tts.synthesize(TEXT, rate=10.0))


@pytest.mark.slow
def test_piper_can_be_stopped_mid_phrase(piper_tts: PiperTts):
    gen = piper_tts.synthesize(TEXT)
    first = next(gen)
    gen.close()  # what a cancelled reply does from the worker thread
    assert len(first) > 0
    with pytest.raises(StopIteration):
        next(gen)


@pytest.mark.slow
def test_piper_with_a_thread_budget_builds_one_session_with_it(tiny_transcriber):
    """threads: the voice's one ONNX session has that many intra-op threads, and speaks as well as the default."""
    from parley.locate import find_embedded

    tts = PiperTts(find_embedded("tts"), threads=1)
    assert tts._voice.session.get_session_options().intra_op_num_threads == 1
    assert tts.sample_rate == 22050 and tts._base_length_scale > 0  # the voice's own config, read
    audio = np.concatenate(list(tts.synthesize(TEXT, rate=1.2)))
    text = tiny_transcriber.transcribe(corpus.to_16k(audio, tts.sample_rate)).text
    assert corpus.wer(TEXT, text) <= 0.15, text


def test_piper_speech_is_understood(piper_tts: PiperTts, tiny_transcriber):
    audio = np.concatenate(list(piper_tts.synthesize(TEXT, rate=1.2)))
    text = tiny_transcriber.transcribe(corpus.to_16k(audio, piper_tts.sample_rate)).text
    assert corpus.wer(TEXT, text) <= 0.10


@pytest.mark.parametrize("kind, voice, rate", [("flite", None, 16000), ("flite", "kal", 8000), ("espeak-ng", None, 22050)])
def test_command_tts_reports_its_native_rate(kind, voice, rate):
    tts = CommandTts(kind, voice)
    assert tts.sample_rate == rate
    audio = np.concatenate(list(tts.synthesize("Hello there, how are you?")))
    assert audio.dtype == np.float32 and 0.8 < len(audio) / rate < 4.0


def test_command_tts_resamples_and_follows_rate():
    tts = CommandTts("flite", "kal", sample_rate=16000)
    normal = sum(map(len, tts.synthesize("Set a timer for ten minutes please.")))
    fast = sum(map(len, tts.synthesize("Set a timer for ten minutes please.", rate=1.5)))
    assert tts.sample_rate == 16000 and fast < 0.8 * normal
    assert list(tts.synthesize("   ")) == []


def test_parse_wav_handles_streamed_headers():
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(16000)
        w.writeframes(np.array([0, 16384, -16384], dtype="<i2").tobytes())
    data = bytearray(buf.getvalue())
    data[40:44] = b"\xff\xff\xff\xff"  # size unknown, as when written to a pipe
    audio, rate = _parse_wav(bytes(data))
    assert rate == 16000 and audio.tolist() == [0.0, 0.5, -0.5]
    with pytest.raises(RuntimeError):
        _parse_wav(b"not a wav")


@pytest.mark.skipif(importlib.util.find_spec("TTS") is not None, reason="Coqui is installed here")
def test_coqui_without_the_package_names_the_extra():
    with pytest.raises(RuntimeError, match=r"pip install parley\[coqui\]"):
        CoquiTts("tts_models/en/ljspeech/vits")
