"""Voice stage benchmark on this machine: ASR accuracy/speed/final latency, TTS first-chunk time and RTF, VAD cost;
with --asr-batch, several sessions' finals recognised one at a time vs in one batch (voice.asr.transcribe_batch).

Prints tables; asserts nothing. Run: HF_HUB_OFFLINE=1 .venv/bin/python -m bench.stages [--quick] [--asr-batch]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from bench import corpus
from voice.asr import WhisperTranscriber
from voice.turn_policy import TurnPolicy
from voice.tts import CommandTts, PiperTts
from voice.vad import SileroVad, WebRtcVad
from parley.locate import find_embedded


def table(title: str, header: list[str], rows: list[list[object]]) -> None:
    cells = [header] + [[f"{c:.3f}" if isinstance(c, float) else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    print(f"\n{title}")
    for i, row in enumerate(cells):
        print("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)))
        if i == 0:
            print("  " + "  ".join("-" * w for w in widths))


def bench_asr(voices: dict[str, list[np.ndarray]], head_start_ms: float) -> None:
    rows = []
    for name, source in (("tiny.en", "embedded"), ("base", "embedded-base")):
        t0 = time.perf_counter()
        asr = WhisperTranscriber(find_embedded("asr", source))
        load_s = time.perf_counter() - t0
        asr.transcribe(voices["piper"][0])  # warm-up: first call allocates
        for voice, clips in voices.items():
            results = [asr.transcribe(a) for a in clips]
            audio_ms = sum(r.audio_ms for r in results)
            decode = [r.decode_ms for r in results]
            score = corpus.wer(corpus.REQUESTS[: len(clips)], [r.text for r in results])
            # the final starts ahead of the end-of-turn check; only what outlasts that head start is felt
            after_endpoint = [max(0.0, d - head_start_ms) for d in decode]
            rows.append([name, voice, len(clips), score, sum(decode) / audio_ms, statistics.median(decode),
                         max(decode), statistics.median(after_endpoint), max(after_endpoint), load_s])  # fmt: skip
    table(
        f"ASR (faster-whisper int8_float32, beam 1, CPU, window fitted to the utterance); the final starts "
        f"{head_start_ms:.0f} ms before the end-of-turn check",
        ["model", "voice", "clips", "WER", "RTF", "final p50 ms", "final max ms", "after endpoint p50 ms",
         "after endpoint max ms", "load s"],
        rows,
    )  # fmt: skip


def bench_tts() -> None:
    first_phrase = "Sure, I can help with that."
    reply = "It will be sunny this afternoon with a light breeze. It is a good day for a walk in the park."
    rows = []
    for name, tts in (("piper joe", PiperTts(find_embedded("tts"))), ("flite slt", CommandTts("flite")),
                      ("flite kal", CommandTts("flite", "kal")), ("espeak-ng", CommandTts("espeak-ng"))):  # fmt: skip
        list(tts.synthesize("Warm up."))
        for label, text in (("first phrase", first_phrase), ("two sentences", reply)):
            ttfc, totals, audio_s = [], [], 0.0
            for _ in range(3):
                t0 = time.perf_counter()
                gen = tts.synthesize(text)
                first = next(gen)
                ttfc.append(1000 * (time.perf_counter() - t0))
                n = len(first) + sum(len(c) for c in gen)
                totals.append(time.perf_counter() - t0)
                audio_s = n / tts.sample_rate
            rows.append([name, label, tts.sample_rate, statistics.median(ttfc), audio_s, statistics.median(totals) / audio_s])
    table("TTS (CPU)", ["backend", "text", "rate Hz", "first chunk ms", "audio s", "RTF"], rows)


def bench_vad(audio: np.ndarray) -> None:
    rows = []
    for name, vad in (("silero", SileroVad(find_embedded("vad"))), ("webrtc", WebRtcVad())):
        n = 16000 * vad.frame_ms // 1000
        frames = [audio[i : i + n] for i in range(0, len(audio) - n + 1, n)]
        t0 = time.perf_counter()
        for f in frames:
            vad.speech_prob(f)
        per_frame_ms = 1000 * (time.perf_counter() - t0) / len(frames)
        rows.append([name, vad.frame_ms, per_frame_ms, per_frame_ms / vad.frame_ms])
    table("VAD (CPU)", ["backend", "frame ms", "ms per frame", "RTF"], rows)


def bench_asr_batch(clips: list[np.ndarray], sizes: tuple[int, ...] = (2, 4), rounds: int = 5) -> None:
    """What the scheduler does when finals of several sessions wait at once: one batch instead of one by one."""
    asr = WhisperTranscriber(find_embedded("asr"))
    asr.transcribe(clips[0])  # warm-up
    rows = []
    for b in sizes:
        one, batch, same = [], [], True
        for r in range(rounds):
            group = [clips[(r * b + i) % len(clips)] for i in range(b)]
            t0 = time.perf_counter()
            alone = [asr.transcribe(a).text for a in group]
            one.append(1000.0 * (time.perf_counter() - t0))
            t0 = time.perf_counter()
            together = [t.text for t in asr.transcribe_batch(group)]
            batch.append(1000.0 * (time.perf_counter() - t0))
            same = same and together == alone
        p50_one, p50_batch = statistics.median(one), statistics.median(batch)
        rows.append([b, rounds, p50_one, p50_batch, p50_one / p50_batch, "yes" if same else "no"])
    table("ASR finals waiting together (tiny.en): one at a time vs one batch, whole group, ms",
          ["finals", "rounds", "one at a time p50", "batch p50", "speed-up", "same text"], rows)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="8 requests instead of the whole corpus")
    parser.add_argument("--head-start-ms", type=float, default=TurnPolicy().turn_check_ms - TurnPolicy().ahead_silence_ms,
                        help="how long before the end-of-turn check the final recognition starts (default: the shipped policy's)")
    parser.add_argument("--asr-batch", action="store_true", help="only the table of finals batched across sessions")
    parser.add_argument("--tiny", action="store_true", help="with --asr-batch: one round of two (a smoke test)")
    args = parser.parse_args()
    load = os.getloadavg()
    print(f"machine: {os.cpu_count()} cores, load average {load[0]:.1f} (1 min) - numbers are only comparable at low load")
    texts = corpus.REQUESTS[:8] if args.quick else corpus.REQUESTS
    if args.asr_batch:
        sizes, rounds = ((2,), 1) if args.tiny else ((2, 4), 5)
        bench_asr_batch([corpus.to_16k(*corpus.speak_piper(t)) for t in texts[: max(sizes) * 2]], sizes, rounds)
        return
    voices = {
        "piper": [corpus.to_16k(*corpus.speak_piper(t)) for t in texts],
        "flite": [corpus.to_16k(*corpus.speak_flite(t)) for t in texts],
        "flite-kal": [corpus.to_16k(*corpus.speak_flite(t, voice="kal")) for t in texts],
    }
    bench_asr(voices, args.head_start_ms)
    bench_tts()
    bench_vad(np.concatenate(voices["piper"]))


if __name__ == "__main__":
    main()
