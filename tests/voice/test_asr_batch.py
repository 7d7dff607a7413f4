"""Several utterances recognised in one batch (voice.asr.WhisperTranscriber.transcribe_batch) say what each says
alone, with the real embedded Whisper: the scheduler may batch sessions' finals without changing a transcript."""
from __future__ import annotations

import numpy as np

from bench import corpus


def test_a_batch_transcribes_each_utterance_as_it_would_alone(tiny_transcriber, corpus_piper) -> None:
    flite = corpus.to_16k(*corpus.speak_flite(corpus.REQUESTS[0]))
    audios = [corpus_piper[1], flite, corpus.silence(1500), corpus_piper[2], np.zeros(800, dtype=np.float32)]
    alone = [tiny_transcriber.transcribe(a).text for a in audios]
    batched = tiny_transcriber.transcribe_batch(audios)
    assert [t.text for t in batched] == alone
    assert alone[0] and alone[1] and alone[3]  # speech heard
    assert batched[2].text == "" and batched[4].text == ""  # silence and a too-short clip give nothing
    assert corpus.wer(corpus.REQUESTS[1], batched[0].text) <= 0.25
