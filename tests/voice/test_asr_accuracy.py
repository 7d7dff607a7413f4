"""Whisper tiny.en (embedded) on the spoken corpus: word error rate per voice, round trip, hallucination guards."""
from __future__ import annotations

import numpy as np
import pytest

import audio_corpus as corpus

MAX_WER = 0.10

pytestmark = pytest.mark.slow


def test_corpus_is_large_enough():
    assert len(corpus.REQUESTS) >= 20


@pytest.mark.parametrize("voice", ["piper", "flite"])
def test_tiny_en_word_error_rate_per_voice(voice, tiny_hypotheses):
    hyps = tiny_hypotheses[voice]
    score = corpus.wer(corpus.REQUESTS, hyps)
    misses = [(r, h) for r, h in zip(corpus.REQUESTS, hyps) if corpus.wer(r, h) > 0]
    print(f"\ntiny.en WER on {voice} ({len(hyps)} requests): {score:.4f}")
    for ref, hyp in misses:
        print(f"  ref: {ref}\n  hyp: {hyp}")
    assert score <= MAX_WER


def test_round_trip_piper_replies_come_back_as_text(tiny_transcriber):
    audios = [corpus.to_16k(*corpus.speak_piper(reply)) for reply in corpus.REPLIES]
    transcripts = [tiny_transcriber.transcribe(a) for a in audios]
    score = corpus.wer(corpus.REPLIES, [t.text for t in transcripts])
    print(f"\nround trip WER over {len(audios)} replies: {score:.4f}")
    for reply, t in zip(corpus.REPLIES, transcripts):
        print(f"  {corpus.wer(reply, t.text):.3f} {t.text!r}")
    assert score <= MAX_WER
    for audio, t in zip(audios, transcripts):
        assert t.audio_ms == pytest.approx(1000 * len(audio) / 16000)
        assert t.no_speech_prob < 0.5 and t.avg_logprob > -1.0


@pytest.mark.parametrize(
    "audio",
    [
        corpus.silence(3000),
        corpus.white_noise(3000, level=0.1, seed=4),
        corpus.white_noise(3000, level=0.4, seed=5),
        corpus.silence(50),
    ],
    ids=["silence", "noise-20dB", "noise-8dB", "50ms"],
)
def test_silence_and_noise_give_no_text(tiny_transcriber, audio):
    transcript = tiny_transcriber.transcribe(audio)
    assert transcript.text == ""
    assert transcript.no_speech_prob == 1.0


def test_speech_padded_with_silence_is_not_padded_with_invented_words(tiny_transcriber, corpus_piper_fixed):
    # The clip without Piper's prosody noise: with it, tiny.en now and then hears "weather light" (a
    # mishearing, not an invented word): it failed one of the five full runs of 2026-11-30.
    audio = np.concatenate([corpus.silence(2000), corpus_piper_fixed[0], corpus.silence(3000)])
    assert corpus.wer(corpus.REQUESTS[0], tiny_transcriber.transcribe(audio).text) == 0.0


def test_wer_normalisation():
    assert corpus.wer("Set a timer for 10 minutes.", "set a timer for ten minutes") == 0.0
    assert corpus.wer("Wake me at 7:00.", "wake me at seven") == 0.0
    assert corpus.wer(["a b c d", "e f"], ["a b x d", ""]) == pytest.approx(3 / 6)
