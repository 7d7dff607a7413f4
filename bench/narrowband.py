"""Telephone audio against the browser's: recognition (WER) and end-of-turn (bench.turns' paused and whole
requests) on the same spoken corpus at 16 kHz and passed through a phone line's G.711 μ-law at 8 kHz (16 kHz ->
8 kHz -> μ-law -> decoded -> 16 kHz by the session's front end, voice.frontend: what /twilio/stream and
/v1/realtime's audio/pcmu hear).

Run:  HF_HUB_OFFLINE=1 .venv/bin/python -m bench.narrowband [--tiny] [--detectors combined,fixed] [--markdown]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from bench import _stats
from bench import corpus as spoken
from bench.turns import Clip, Models, corpus, run_detector, summarize
from voice import codec
from voice.audio import SAMPLE_RATE, resample
from voice.frontend import FrontEnd

BANDS = ("16 kHz", "μ-law 8 kHz")


def phone_line(audio16: np.ndarray) -> np.ndarray:
    """16 kHz float32 as a G.711 μ-law call carries it, back at 16 kHz."""
    narrow = codec.decode("pcmu", codec.encode("pcmu", resample(audio16, SAMPLE_RATE, codec.G711_RATE)))
    heard = FrontEnd().run(narrow, codec.G711_RATE)  # a few ms short: the filter's delay
    return np.concatenate([heard, np.zeros(max(0, len(audio16) - len(heard)), np.float32)])[: len(audio16)]


def banded(clips: list[Clip], band: str) -> list[Clip]:
    if band == BANDS[0]:
        return clips
    return [replace(c, name=f"{band}/{c.name}", audio=phone_line(c.audio)) for c in clips]


def word_error(clips: list[Clip], models: Models) -> tuple[float, int]:
    """WER of the whole requests (each clip's text after ': '), the corpus's words pooled. -> (WER, words)."""
    refs, hyps = [], []
    for c in clips:
        if c.pause_ms is None:
            refs.append(c.name.split(": ", 1)[1])
            hyps.append(models.asr.transcribe(c.audio).text)
    return spoken.wer(refs, hyps), sum(len(spoken.normalize_text(r).split()) for r in refs)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--detectors", default="combined,fixed", help="bench.turns detectors (default combined,fixed)")
    p.add_argument("--voices", default="piper")
    p.add_argument("--styles", default="comma,split")
    p.add_argument("--paused", type=int, default=18)
    p.add_argument("--complete", type=int, default=22)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="config overrides (vad.* keys, models.asr.beam_size)")
    p.add_argument("--out", default="artifacts/bench/narrowband.json")
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--tiny", action="store_true", help="two paused and two whole requests, one voice, one detector")
    args = p.parse_args(argv)
    if args.tiny:
        args.voices, args.styles, args.paused, args.complete, args.detectors = "piper-steady", "comma", 2, 2, "fixed"
    from parley.config import load_config
    from parley.runtime import turn_policy

    cfg = load_config(None, args.set)
    base = turn_policy(cfg)
    t0 = time.monotonic()
    wide = corpus(args.voices.split(","), args.styles.split(","), args.paused, args.complete)
    models = Models(cfg.persona(None).system_prompt)
    models.asr.beam_size = cfg.models.asr.beam_size  # --set models.asr.beam_size=5: what a phone line gains from
    results: dict[str, Any] = {}
    rows = []
    try:
        for band in BANDS:
            clips = banded(wide, band)
            wer, words = word_error(clips, models)
            results[band] = {"wer": wer, "words": words, "detectors": {}}
            for det in args.detectors.split(","):
                outcomes, costs = run_detector(clips, replace(base, detection=det), models)
                s = summarize(outcomes, costs)
                results[band]["detectors"][det] = {**s, "early": [o.clip.name for o in outcomes if o.early]}
                f = _stats.fmt_ms
                rows.append([band, det, f"{100 * wer:.1f} % of {words}", f"{s['cut_early']}/{s['paused']}",
                             f"{s['split']}/{s['paused']}", f"{s['whole_cut']}/{s['whole']}", f(s["delay_p50"]),
                             f(s["delay_p95"])])  # fmt: skip
                print(f"  {band} {det}: done ({time.monotonic() - t0:.0f} s)", flush=True)
    finally:
        models.close()
    table = _stats.markdown if args.markdown else _stats.table
    print(f"\nNarrowband: {len(wide)} clips ({sum(c.pause_ms is not None for c in wide)} paused), voices {args.voices}")
    print(table(("audio", "detector", "WER (whole requests)", "paused cut early", "split after rejoin", "whole cut",
                 "endpoint p50 ms", "p95 ms"), rows))  # fmt: skip
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"argv": sys.argv[1:] if argv is None else argv, "wall_s": round(time.monotonic() - t0, 1),
                               "bands": results}, indent=1))  # fmt: skip
    print(f"wrote {out} in {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
