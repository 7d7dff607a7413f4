"""StreamingTranscriber: stable partials on real speech, a final equal to the offline decode, no loop blocking."""
from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from bench import corpus
from voice.asr import StreamingTranscriber, Transcript
from support.waiting import wait_for

CHUNK = 1600  # 100 ms, what the session appends per batch of frames


async def stream(st: StreamingTranscriber, audio: np.ndarray) -> list[str]:
    snapshots = []
    for i in range(0, len(audio), CHUNK):
        st.append(audio[i : i + CHUNK])
        if await st.partial() is not None:
            snapshots.append(st.committed)
    return snapshots


@pytest.mark.slow
@pytest.mark.parametrize("indices", [(0, 2), (6, 16)])
async def test_committed_never_changes_and_final_matches_offline(indices, tiny_transcriber, corpus_piper_fixed):
    audio = np.concatenate([corpus_piper_fixed[indices[0]], corpus.silence(300), corpus_piper_fixed[indices[1]]])
    st = StreamingTranscriber(tiny_transcriber, partial_interval_ms=500)
    snapshots = await stream(st, audio)
    print(f"\npartials: {snapshots}")
    assert len(snapshots) >= 2  # partials arrive while the user is still speaking
    for before, after in zip(snapshots, snapshots[1:]):
        assert after.split()[: len(before.split())] == before.split()
    final = await st.final()
    offline = tiny_transcriber.transcribe(audio)
    assert final.text == offline.text
    reference = f"{corpus.REQUESTS[indices[0]]} {corpus.REQUESTS[indices[1]]}"
    assert corpus.wer(reference, final.text) <= 0.10
    # the final re-decodes everything, so it may correct a committed word, but by at most one
    committed = corpus.normalize_text(st.committed).split()
    head = corpus.normalize_text(final.text).split()[: len(committed)]
    assert sum(a != b for a, b in zip(committed, head)) + abs(len(committed) - len(head)) <= 1


class RecordingTranscriber:
    """Fake Transcriber: returns scripted text and records the audio length and thread of each call."""

    streams_partials = True
    transcribe_batch = None

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts
        self.calls: list[tuple[int, int]] = []

    def transcribe(self, audio: np.ndarray) -> Transcript:
        self.calls.append((len(audio), threading.get_ident()))
        text = self.texts[min(len(self.calls) - 1, len(self.texts) - 1)]
        return Transcript(text, 0.0, -0.1, 1000 * len(audio) / 16000, 1.0)


async def test_partials_are_decoded_at_the_interval_in_a_worker_thread():
    fake = RecordingTranscriber(["set a", "set a timer", "set a timer for", "set a timer for ten"])
    st = StreamingTranscriber(fake, partial_interval_ms=500, min_partial_audio_ms=500)
    results = []
    for _ in range(25):  # 2.5 s in 100 ms appends
        st.append(np.zeros(CHUNK, dtype=np.float32))
        results.append(await st.partial())
    assert [n for n, _ in fake.calls] == [8000, 16000, 24000, 32000, 40000]
    assert all(tid != threading.get_ident() for _, tid in fake.calls)
    # the last two decodes both said "set a timer for ten" (the fake repeats its last text)
    assert [r for r in results if r] == ["set a", "set a timer", "set a timer for", "set a timer for ten"]
    assert st.committed == "set a timer for ten"


async def test_final_can_start_during_the_hangover_and_reset_starts_a_new_utterance():
    fake = RecordingTranscriber(["remind me to call"])
    st = StreamingTranscriber(fake, partial_interval_ms=500)
    st.append(np.ones(16000, dtype=np.float32))
    task = asyncio.create_task(st.final())  # SpeechPaused: recognition runs ahead
    st.append(np.zeros(8000, dtype=np.float32))  # hangover silence keeps arriving
    final = await task  # SpeechEnded
    assert final.text == "remind me to call" and fake.calls[0][0] == 16000
    st.reset()
    assert st.audio_ms == 0.0 and st.committed == "" and await st.partial() is None


async def test_a_partial_while_a_decode_runs_returns_none_instead_of_queueing():
    gate = threading.Event()

    class SlowTranscriber(RecordingTranscriber):
        def transcribe(self, audio: np.ndarray) -> Transcript:
            gate.wait(5)
            return super().transcribe(audio)

    st = StreamingTranscriber(SlowTranscriber(["x"]), partial_interval_ms=100, min_partial_audio_ms=100)
    st.append(np.zeros(3200, dtype=np.float32))
    first = asyncio.create_task(st.partial())
    await wait_for(st._lock.locked, what="the first partial to start decoding")
    st.append(np.zeros(3200, dtype=np.float32))
    assert await st.partial() is None
    gate.set()
    await first
