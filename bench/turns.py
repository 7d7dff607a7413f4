"""End-of-turn detectors on a pause corpus: how often a request with a pause in the middle is cut in two, how long
a finished request waits for its endpoint, and what a check costs.

The real turn-taking core runs over the real models (Silero frames, Smart Turn, Whisper, the engine's end-of-turn
probe) in audio time: each result reaches the core after the compute time it took here, as it would live for one
session on an otherwise idle machine. Requests are spoken by Piper, flite and espeak-ng; the paused ones with the
pause stretched at a syntactic break (bench/corpus.py: PAUSED_REQUESTS, speak_paused).

Run:  HF_HUB_OFFLINE=1 .venv/bin/python -m bench.turns [--tiny] [--detectors fixed,text] [--llm embedded-135m] [--markdown]
"""
from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from bench import _stats
from bench import corpus as spoken
from voice.audio import SAMPLE_RATE
from voice.interjection import Heard
from voice.turntaking import CheckTurn, DropAhead, EndTurn, Join, OpenTurn, Recognise, StartAhead, TurnTaking
from voice.smart_turn import with_silence_to_come
from voice.turn_policy import DETECTIONS, TurnPolicy

LEAD_MS = 300.0  # silence before each request
TAIL_MS = 2600.0  # silence after it: longer than the longest hangover
PREROLL_MS = 220.0  # what the server keeps before a turn's qualifying speech


@dataclass(frozen=True)
class Clip:
    name: str
    voice: str
    audio: np.ndarray = field(repr=False)  # float32 [N] at 16 kHz, silence around the speech
    speech_end_ms: float  # end of the last word
    pause_ms: tuple[float, float] | None = None  # the pause inside a paused request: (start, end)


@dataclass
class Outcome:
    detector: str
    clip: Clip
    ends: list[tuple[float, EndTurn]]  # (audio ms when the core ended a turn, the action)
    joins: int  # continuations the safety net joined to the request they continue

    @property
    def early(self) -> bool:
        """A turn ended inside the request: in its pause (paused) or before its last word (complete)."""
        limit = self.clip.pause_ms[1] if self.clip.pause_ms else self.clip.speech_end_ms
        return any(t < limit for t, _ in self.ends)

    @property
    def split(self) -> bool:
        """Cut in two even after the safety net: more than one turn was answered."""
        return len(self.ends) - self.joins > 1

    @property
    def delay_ms(self) -> float | None:
        """From the end of the last word to the endpoint that answers the whole request."""
        last = [t for t, _ in self.ends if t >= self.clip.speech_end_ms]
        return last[0] - self.clip.speech_end_ms if last else None


class Models:
    """The real stages, each result memoised with the time it took (detectors share a clip's work). The audio model
    and the engine load only for a detector that uses them (`need`, before its clips: never inside a timing)."""

    def __init__(self, system_prompt: str, llm_source: str = "embedded") -> None:
        from voice.asr import WhisperTranscriber
        from voice.vad import SileroVad
        from parley.locate import find_embedded
        from parley.thread_budget import ThreadBudget, available_cores

        self.vad = SileroVad(find_embedded("vad"))
        # every detector recognises its turns ahead, on the server's threads (so with its transcripts)
        self.asr = WhisperTranscriber(find_embedded("asr"), cpu_threads=ThreadBudget.for_cores(available_cores()).asr)
        self.system_prompt, self.llm_source = system_prompt, llm_source
        self._memo: dict[tuple[Any, ...], tuple[Any, float]] = {}

    def need(self, policy: TurnPolicy) -> None:
        if policy.uses_audio:
            self.turn_model  # noqa: B018 (loads it)
        if policy.uses_text:
            self.engine  # noqa: B018

    @functools.cached_property
    def turn_model(self) -> Any:
        from voice.smart_turn import SmartTurn
        from parley.locate import find_embedded

        return SmartTurn(find_embedded("turn"))

    @functools.cached_property
    def engine(self) -> Any:
        from llm_engine.engine import Engine
        from llm_engine.threads import on_own_thread
        from parley.locate import resolve

        path = resolve("llm", self.llm_source)
        engine = on_own_thread(lambda: Engine.from_path(path, quant="int4", max_seq_len=1024, max_slots=2))
        engine.start()
        return engine

    def text_even_odds(self, default: float) -> float:
        """The text probe's even odds for the model the engine loaded (llm_engine.families), as a session takes them."""
        family = getattr(self.engine, "family", None)
        return family.text_even_odds if family is not None else default

    def close(self) -> None:
        if "engine" in self.__dict__:
            self.engine.stop()

    def _timed(self, key: tuple[Any, ...], fn: Callable[[], Any]) -> tuple[Any, float]:
        if key not in self._memo:
            t0 = time.perf_counter()
            value = fn()
            self._memo[key] = (value, 1000.0 * (time.perf_counter() - t0))
        return self._memo[key]

    def vad_probs(self, clip: Clip) -> list[float]:
        def run() -> list[float]:
            self.vad.reset()
            n = int(SAMPLE_RATE * self.vad.frame_ms / 1000)
            return [self.vad.speech_prob(clip.audio[i : i + n]) for i in range(0, len(clip.audio) - n + 1, n)]

        return self._timed(("vad", clip.name), run)[0]

    def audio_prob(self, clip: Clip, start: int, end: int, audio: np.ndarray | None = None) -> tuple[float, float]:
        """The audio model on the clip's [start, end), or on `audio` made from it (keyed apart)."""
        heard = clip.audio[start:end] if audio is None else audio
        return self._timed(("audio", clip.name, start, end, audio is None), lambda: self.turn_model.complete_prob(heard))

    def final(self, clip: Clip, start: int, end: int) -> tuple[str, float]:
        return self._timed(("asr", clip.name, start, end), lambda: self.asr.transcribe(clip.audio[start:end]).text.strip())

    def heard(self, clip: Clip, start: int, end: int) -> tuple[Heard, float]:
        """What an interjection's words look like to turn-taking (a continuation after an early endpoint)."""
        def run() -> Heard:
            t = self.asr.transcribe(clip.audio[start:end])
            return Heard(t.text, t.avg_logprob, t.audio_ms)

        return self._timed(("heard", clip.name, start, end), run)

    def text_prob(self, text: str) -> tuple[float | None, float]:
        from llm_engine.request import ChatMessage, GenerateRequest, SamplingParams

        def probe() -> float | None:
            msgs = (ChatMessage("system", self.system_prompt), ChatMessage("user", text))
            req = GenerateRequest("bench", msgs, SamplingParams(max_new_tokens=0), probe_user_end=True)
            return self.engine.submit(req).collect()[2].end_prob

        return self._timed(("text", text), probe) if text else (None, 0.0)


def simulate(clip: Clip, policy: TurnPolicy, models: Models, audio_ahead: bool = False) -> tuple[Outcome, list[dict[str, float]]]:
    """One clip through the core, in audio time. -> the outcome and each check's costs. `audio_ahead`: the audio
    model runs at the pause on the turn with the check's silence filled in (vad.audio_check_ahead), beside the final."""
    core = TurnTaking(policy)
    frame_ms = float(models.vad.frame_ms)
    core.listen(frame_ms, models.vad.end_lag_ms)
    ms = lambda samples: 1000.0 * samples / SAMPLE_RATE  # noqa: E731
    at = lambda t_ms: int(t_ms * SAMPLE_RATE / 1000)  # noqa: E731
    starts: dict[int, int] = {}  # turn -> first sample of its audio
    own: dict[int, int] = {}  # turn -> first sample of its own speech (a continuation's audio starts with its request's)
    ready: dict[int, tuple[float, float | None, float]] = {}  # turn -> (audio ms the work ahead is done, text prob, its ms)
    early: dict[int, tuple[float, float, float]] = {}  # turn -> (audio ms the pause's audio score is in, it, its ms)
    due: list[tuple[float, Callable[[], list[Any]]]] = []
    ends: list[tuple[float, EndTurn]] = []
    costs: list[dict[str, float]] = []
    joins = 0
    for i, prob in enumerate(models.vad_probs(clip)):
        t_ms = i * frame_ms
        now = t_ms + frame_ms
        actions = core.frame(prob, t_ms)
        for when, deliver in [d for d in due if d[0] <= now]:
            due.remove((when, deliver))
            actions += deliver()
        for a in actions:
            if isinstance(a, OpenTurn):
                own[a.turn_id] = max(0, at(a.start_ms - PREROLL_MS))
                starts[a.turn_id] = starts[a.joins] if a.joins is not None else own[a.turn_id]
            elif isinstance(a, Join):
                joins += 1
            elif isinstance(a, Recognise):  # a continuation: its words decide whether it joins the request
                heard, asr_ms = models.heard(clip, own[a.turn_id], at(now))
                due.append((now + asr_ms, lambda a=a, heard=heard: core.interjection_heard(a.turn_id, a.n, heard, [])))
            elif isinstance(a, StartAhead):
                if policy.uses_audio and audio_ahead:  # the check's audio model at the pause, beside the final
                    start = starts[a.turn_id]
                    padded = with_silence_to_come(clip.audio[start : at(now)], policy.ahead_silence_ms, policy.turn_check_ms)
                    prob, audio_ms = models.audio_prob(clip, start, at(now), padded)
                    early[a.turn_id] = (now + audio_ms, prob, audio_ms)
                text, asr_ms = models.final(clip, starts[a.turn_id], at(now))
                text_prob, probe_ms = models.text_prob(text) if policy.uses_text else (None, 0.0)
                ready[a.turn_id] = (now + asr_ms + probe_ms, text_prob, probe_ms)
            elif isinstance(a, DropAhead):
                ready.pop(a.turn_id, None)
                early.pop(a.turn_id, None)
            elif isinstance(a, CheckTurn):
                audio_at = now
                if a.turn_id in early:
                    audio_at, audio_prob, audio_ms = early.pop(a.turn_id)
                elif policy.uses_audio:
                    audio_prob, audio_ms = models.audio_prob(clip, starts[a.turn_id], at(now))
                    audio_at = now + audio_ms
                else:
                    audio_prob, audio_ms = None, 0.0
                when, text_prob, probe_ms = ready.get(a.turn_id, (now, None, 0.0)) if policy.uses_text else (now, None, 0.0)
                done = max(now, audio_at, when)
                costs.append({"audio_ms": audio_ms, "probe_ms": probe_ms, "wait_ms": done - now})
                turn, check = a.turn_id, a.check
                due.append((done, lambda turn=turn, check=check, ap=audio_prob, tp=text_prob, c=done - now:
                            core.check_done(turn, check, ap, tp, c)))  # fmt: skip
            elif isinstance(a, EndTurn):
                ends.append((now, a))
    return Outcome(policy.detection, clip, ends, joins), costs


def run_detector(clips: list[Clip], policy: TurnPolicy, models: Models, audio_ahead: bool = False) -> tuple[list[Outcome], list[dict[str, float]]]:
    """Every clip through one detector (its models loaded first). -> the outcomes and every check's costs."""
    models.need(policy)
    outcomes, costs = [], []
    for clip in clips:
        outcome, c = simulate(clip, policy, models, audio_ahead)
        outcomes.append(outcome)
        costs += c
    return outcomes, costs


def corpus(voices: list[str], styles: list[str], n_paused: int, n_complete: int) -> list[Clip]:
    c = spoken
    lead, tail = c.silence(LEAD_MS), c.silence(TAIL_MS)
    clips: list[Clip] = []
    for v, voice in enumerate(voices):
        for i, (first, second) in enumerate(c.PAUSED_REQUESTS[:n_paused]):
            for s, style in enumerate(styles):
                pause = c.PAUSES_MS[(i + v + s) % len(c.PAUSES_MS)]
                speech, pause_at = c.speak_paused(first, second, voice, pause, style=style)
                clips.append(Clip(f"{voice}/{style}/{pause:.0f}: {first} | {second}", voice,
                                  np.concatenate([lead, speech, tail]), LEAD_MS + 1000.0 * len(speech) / SAMPLE_RATE,
                                  (LEAD_MS + pause_at, LEAD_MS + pause_at + pause)))  # fmt: skip
        for text in c.REQUESTS[:n_complete]:
            speech = c._trim(c.speak(text, voice))
            clips.append(Clip(f"{voice}/whole: {text}", voice, np.concatenate([lead, speech, tail]),
                              LEAD_MS + 1000.0 * len(speech) / SAMPLE_RATE))  # fmt: skip
    return clips


def summarize(outcomes: list[Outcome], costs: list[dict[str, float]]) -> dict[str, Any]:
    paused = [o for o in outcomes if o.clip.pause_ms]
    whole = [o for o in outcomes if not o.clip.pause_ms]
    delays = [d for o in whole if (d := o.delay_ms) is not None]
    pct = lambda xs, q: _stats.percentile(xs, q) if xs else None  # noqa: E731
    mean = lambda key: float(np.mean([c[key] for c in costs])) if costs else None  # noqa: E731
    return {
        "paused": len(paused),
        "cut_early": sum(o.early for o in paused),
        "split": sum(o.split for o in paused),
        "whole": len(whole),
        "whole_cut": sum(o.early for o in whole),
        "delay_p50": pct(delays, 50), "delay_p95": pct(delays, 95), "delay_max": max(delays) if delays else None,
        "checks": len(costs), "audio_ms": mean("audio_ms"), "probe_ms": mean("probe_ms"), "check_wait_ms": mean("wait_ms"),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--detectors", default=",".join(DETECTIONS), help="comma-separated (default: all four)")
    p.add_argument("--voices", default="piper,flite,espeak")
    p.add_argument("--styles", default="comma,split", help="how the paused requests are spoken (comma, split)")
    p.add_argument("--paused", type=int, default=18, help="paused requests per voice and style (default 18)")
    p.add_argument("--complete", type=int, default=22, help="complete requests per voice (default 22)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config overrides (vad.* keys)")
    p.add_argument("--sweep", default="", metavar="FIELD=V1,V2,...",
                   help="each detector once per value of one TurnPolicy field, e.g. max_hangover_ms=1500,1000")
    p.add_argument("--llm", default="", help="the text probe's model: embedded-135m, embedded-0.5b, ... (default: the config's)")
    p.add_argument("--out", default="artifacts/bench/turns.json")
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--tiny", action="store_true", help="two paused and two complete requests, one voice")
    args = p.parse_args(argv)
    if args.tiny:
        args.voices, args.styles, args.paused, args.complete = "piper-steady", "comma", 2, 2
    from parley.config import load_config
    from parley.runtime import turn_policy

    cfg = load_config(None, args.set)
    base = turn_policy(cfg)
    runs = [(det, replace(base, detection=det)) for det in args.detectors.split(",")]
    field_name = ""
    if args.sweep:
        field_name, _, values = args.sweep.partition("=")
        if field_name not in base.__dataclass_fields__ or not values:
            p.error(f"--sweep wants FIELD=V1,V2 with a TurnPolicy field, got {args.sweep!r}")
        runs = [(f"{det} ({field_name} {v})", replace(policy, **{field_name: float(v)}))
                for det, policy in runs for v in values.split(",")]  # fmt: skip
    t0 = time.monotonic()
    clips = corpus(args.voices.split(","), args.styles.split(","), args.paused, args.complete)
    print(f"{len(clips)} clips ({sum(c.pause_ms is not None for c in clips)} paused); loading models", flush=True)
    models = Models(cfg.persona(None).system_prompt, args.llm or cfg.models.llm.source)
    if any(policy.uses_text for _, policy in runs):  # the probe's calibration is the model's, as in a session
        odds = models.text_even_odds(base.text_even_odds)
        base = replace(base, text_even_odds=odds)
        if field_name != "text_even_odds":  # a sweep of the odds themselves keeps its values
            runs = [(det, replace(policy, text_even_odds=odds)) for det, policy in runs]
    results: dict[str, Any] = {}
    rows, splits = [], []
    try:
        for det, policy in runs:
            outcomes, costs = run_detector(clips, policy, models, cfg.vad.audio_check_ahead)
            s = summarize(outcomes, costs)
            results[det] = {**s, "clips": [{"clip": o.clip.name, "early": o.early, "split": o.split, "delay_ms": o.delay_ms,
                                            "ends": [{"t_ms": t, "reason": e.reason, "checks": [c.to_dict() for c in e.checks]}
                                                     for t, e in o.ends]} for o in outcomes]}  # fmt: skip
            splits += [f"  {det}: {o.clip.name}" for o in outcomes if o.split]
            f = _stats.fmt_ms
            rows.append([det, f"{s['cut_early']}/{s['paused']}", f"{s['split']}/{s['paused']}", f"{s['whole_cut']}/{s['whole']}",
                         f(s["delay_p50"]), f(s["delay_p95"]), f(s["delay_max"]),
                         f"{s['audio_ms']:.1f}" if s["audio_ms"] else "-", f"{s['probe_ms']:.1f}" if s["probe_ms"] else "-",
                         f(s["check_wait_ms"])])  # fmt: skip
            print(f"  {det}: done ({time.monotonic() - t0:.0f} s)", flush=True)
    finally:
        models.close()
    table = _stats.markdown if args.markdown else _stats.table
    print(f"\nEnd-of-turn detectors (audio check {'at the pause' if cfg.vad.audio_check_ahead else 'at the check'}, "
          f"turn_check {base.turn_check_ms:g} ms, max_hangover {base.max_hangover_ms:g} ms, "
          f"fixed hangover {base.hangover_ms:g} ms, sure/unsure {base.sure_prob:g}/{base.unsure_prob:g}, "
          f"rejoin window {base.rejoin_window_ms:g} ms; text probe: {models.llm_source}, even odds "
          f"{base.text_even_odds:g})")  # fmt: skip
    print(table(("detector", "paused cut early", "split after rejoin", "whole cut", "endpoint p50 ms", "p95 ms", "max ms",
                 "audio model ms", "text probe ms", "check wait ms"), rows))  # fmt: skip
    print("\nStill split:" if splits else "\nNothing split.")
    print("\n".join(splits))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"argv": sys.argv[1:] if argv is None else argv, "wall_s": round(time.monotonic() - t0, 1),
                               "policy": {k: v for k, v in base.__dict__.items() if k != "lexicon"}, "detectors": results}, indent=1))  # fmt: skip
    print(f"wrote {out} in {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
