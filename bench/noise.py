"""Noisy rooms: a real person's speech (bench.real_speech) under real music, babble of other real prompts and
stationary noise (a fan's broadband hiss with mains hum) at 20, 10, 5 and 0 dB SNR, heard through the session's
front end with noise suppression off and on (audio.denoise), then recognised by the server's Whisper; and each noise
alone, at the level it has at 5 dB SNR, through the VAD and the endpointer: turns it would open.

Rows: WER per noise and SNR, turns opened by 60 s of noise alone, the suppressor's delay (what it adds to every
endpoint) and its CPU per second of audio.

Run:  HF_HUB_OFFLINE=1 .venv/bin/python -m bench.noise [--tiny] [--prompts 30] [--denoise none,rnnoise,deepfilternet]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench import corpus, real_speech
from voice.audio import SAMPLE_RATE
from voice.endpointer import Endpointer, SpeechStarted
from voice.frontend import FrontEnd

SNRS_DB = (20, 10, 5, 0)
NOISES = ("music", "babble", "fan")
PAD_S = 0.5  # noise alone before and after the speech


def fan(seconds: float, seed: int = 0) -> np.ndarray:
    """Stationary noise: pink-ish broadband hiss (white noise through a one-pole low-pass) and 100 Hz hum with its
    harmonics."""
    rng = np.random.default_rng(seed)
    n = int(seconds * SAMPLE_RATE)
    white = rng.standard_normal(n)
    hiss = np.zeros(n)
    acc = 0.0
    for i in range(n):  # y[i] = 0.95 y[i-1] + x[i]
        acc = 0.95 * acc + white[i]
        hiss[i] = acc
    t = np.arange(n) / SAMPLE_RATE
    hum = sum(np.sin(2 * np.pi * 100 * k * t) / k for k in range(1, 6))
    out = hiss / np.std(hiss) + 0.5 * hum / np.std(hum)
    return (out / np.std(out)).astype(np.float32)


def babble(prompts: list[real_speech.Prompt], seconds: float, talkers: int = 3, seed: int = 0) -> np.ndarray:
    """`talkers` real prompts at once, each a chain of prompts laid end to end from a random start."""
    rng = np.random.default_rng(seed)
    n = int(seconds * SAMPLE_RATE)
    out = np.zeros(n, np.float32)
    for _ in range(talkers):
        chain = np.concatenate([prompts[i].audio for i in rng.permutation(len(prompts))])
        start = int(rng.integers(0, max(1, len(chain) - n)))
        out += np.resize(chain[start:], n)
    return out / np.std(out)


def speech_rms(audio: np.ndarray) -> float:
    """RMS over the 20 ms frames within 40 dB of the loudest: the speech, not its pauses."""
    frames = audio[: len(audio) // 320 * 320].reshape(-1, 320)
    rms = np.sqrt(np.mean(frames**2, axis=1))
    return float(np.sqrt(np.mean(rms[rms > rms.max() * 0.01] ** 2)))


def mix(speech: np.ndarray, noise: np.ndarray, snr_db: float) -> np.ndarray:
    pad = int(PAD_S * SAMPLE_RATE)
    clip = np.concatenate([np.zeros(pad, np.float32), speech, np.zeros(pad, np.float32)])
    scale = speech_rms(speech) / (np.std(noise[: len(clip)]) * 10 ** (snr_db / 20))
    return (clip + scale * np.resize(noise, len(clip))).astype(np.float32)


def denoised(audio: np.ndarray, backend: str) -> tuple[np.ndarray, float]:
    """`audio` through a session's front end with `backend` (20 ms messages) -> (what is heard, CPU seconds)."""
    stages = [] if backend == "none" else [_denoiser(backend)]
    front = FrontEnd(stages)  # type: ignore[arg-type]
    t0 = time.process_time()
    out = np.concatenate([front.run(audio[i : i + 320], SAMPLE_RATE) for i in range(0, len(audio), 320)])
    return out, time.process_time() - t0


def _denoiser(backend: str) -> Any:
    from voice.denoise import Denoiser

    return Denoiser(backend)  # type: ignore[arg-type]


def opened_turns(audio: np.ndarray, vad: Any, min_speech_ms: float, hangover_ms: float) -> int:
    """Turns the endpointer opens on `audio` (the server's VAD and thresholds)."""
    vad.reset()
    ep = Endpointer.for_vad(vad, 0.5, min_speech_ms, hangover_ms)
    frame = int(SAMPLE_RATE * vad.frame_ms / 1000)
    opened = 0
    for i in range(0, len(audio) - frame + 1, frame):
        opened += sum(isinstance(e, SpeechStarted) for e in ep.push(vad.speech_prob(audio[i : i + frame]), 1000.0 * i / SAMPLE_RATE))
    return opened


def run(n_prompts: int, backends: list[str], snrs: tuple[int, ...], noise_s: float) -> dict[str, Any]:
    from parley.config import load_config
    from parley.locate import find_embedded
    from parley.thread_budget import ThreadBudget, available_cores
    from voice.asr import WhisperTranscriber
    from voice.vad import SileroVad

    cfg = load_config()
    all_prompts = real_speech.prompts()
    tested = all_prompts[:: max(1, len(all_prompts) // n_prompts)][:n_prompts]
    others = [p for p in all_prompts if p not in tested]
    total_s = sum(len(p.audio) for p in tested) / SAMPLE_RATE + 2 * PAD_S * len(tested)
    noises = {"music": real_speech.music(max(total_s, noise_s) + 5), "babble": babble(others, max(total_s, noise_s) + 5),
              "fan": fan(max(total_s, noise_s) + 5)}  # fmt: skip
    asr = WhisperTranscriber(find_embedded("asr"), cpu_threads=ThreadBudget.for_cores(available_cores()).asr)
    vad = SileroVad(find_embedded("vad"))
    level = np.mean([speech_rms(p.audio) for p in tested])
    rows: list[dict[str, Any]] = []
    refs = [p.text for p in tested]
    for backend in backends:
        cpu_s, audio_s = 0.0, 0.0
        conditions = [("clean", None)] + [(n, s) for n in NOISES for s in snrs]
        for noise, snr in conditions:
            hyps, offset = [], 0
            for p in tested:
                clip = mix(p.audio, noises[noise][offset:] if noise != "clean" else np.zeros(1, np.float32), snr or 0) \
                    if noise != "clean" else np.concatenate([np.zeros(int(PAD_S * SAMPLE_RATE), np.float32), p.audio])
                offset += len(clip)
                heard, cpu = denoised(clip, backend)
                cpu_s, audio_s = cpu_s + cpu, audio_s + len(clip) / SAMPLE_RATE
                hyps.append(asr.transcribe(heard).text)
            rows.append({"denoise": backend, "noise": noise, "snr_db": snr, "wer": corpus.wer(refs, hyps)})
            print(f"  {backend:13s} {noise:6s} {'' if snr is None else snr:>3} dB  WER {100 * rows[-1]['wer']:.1f} %", flush=True)
        for noise in NOISES:
            alone = noises[noise][: int(noise_s * SAMPLE_RATE)] * level / 10 ** (5 / 20)
            heard, _ = denoised(alone, backend)
            opened = opened_turns(heard, vad, cfg.vad.min_speech_ms, cfg.vad.max_hangover_ms)
            rows.append({"denoise": backend, "noise": noise, "alone_s": noise_s, "turns_opened": opened})
        delay = 0.0 if backend == "none" else _denoiser(backend).delay_ms
        rows.append({"denoise": backend, "delay_ms": delay, "cpu_per_audio_s": cpu_s / max(audio_s, 1e-9)})
    return {"prompts": len(tested), "words": sum(len(corpus.normalize_text(r).split()) for r in refs), "rows": rows}


def table(result: dict[str, Any], snrs: tuple[int, ...]) -> str:
    rows = result["rows"]
    backends = list(dict.fromkeys(r["denoise"] for r in rows))
    head = ["denoise", "clean"] + [f"{n} {s} dB" for n in NOISES for s in snrs] + [f"turns by {n} alone" for n in NOISES]
    head += ["delay ms", "CPU % of a core"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for b in backends:
        mine = [r for r in rows if r["denoise"] == b]
        wer = {(r["noise"], r["snr_db"]): r["wer"] for r in mine if "wer" in r}
        cells = [b, f"{100 * wer[('clean', None)]:.1f} %"] + [f"{100 * wer[(n, s)]:.1f} %" for n in NOISES for s in snrs]
        cells += [str(next(r["turns_opened"] for r in mine if r.get("turns_opened") is not None and r["noise"] == n)) for n in NOISES]
        cost = next(r for r in mine if "delay_ms" in r)
        cells += [f"{cost['delay_ms']:.1f}", f"{100 * cost['cpu_per_audio_s']:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=30)
    p.add_argument("--denoise", default="none,rnnoise,deepfilternet")
    p.add_argument("--snrs", default=",".join(map(str, SNRS_DB)))
    p.add_argument("--noise-s", type=float, default=60.0, help="seconds of each noise alone (turns opened)")
    p.add_argument("--tiny", action="store_true", help="2 prompts, 5 dB, 10 s of noise alone")
    p.add_argument("--out", default="artifacts/bench/noise.json")
    args = p.parse_args(argv)
    snrs = tuple(int(s) for s in args.snrs.split(","))
    n, noise_s = args.prompts, args.noise_s
    if args.tiny:
        n, snrs, noise_s = 2, (5,), 10.0
    if not real_speech.available():
        print(f"bench.noise: the real-speech corpus is missing: apt-get install {real_speech.PACKAGES}", file=sys.stderr)
        return 2
    result = run(n, args.denoise.split(","), snrs, noise_s)
    print(f"\nNoisy rooms: {result['prompts']} real prompts ({result['words']} words), noise alone {noise_s:g} s each")
    print(table(result, snrs))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
