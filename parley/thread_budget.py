"""How many threads each CPU stage may use, sized together from the cores this process may run on, instead of
each library assuming the whole machine (CTranslate2 and onnxruntime default to every core, and so does the
engine's OpenMP pool).

- engine: every core the running stage jobs leave (engine_team, asked before each step: a team thread that
  shares a core with a stage job's holds up the step at every barrier). It is what a user waits on most.
- stage_workers: how many recognitions, syntheses and turn checks run at once (voice.scheduler): one more than
  the cores, at least three, so that while a partial and a later phrase run, a final transcript, a turn check or
  a first phrase still finds a worker (voice.stage_queue keeps one for them).
- per job: two intra-op threads for synthesis (Piper, first phrases of 4-8 words on the 2-core dev machine: median
  48 ms with 2 threads vs 61 with 1), one for recognition and for the VAD and the Smart Turn check. Whisper tiny.en
  over its fitted window (voice.asr) decodes faster on one thread than on two, and steadier (`python -m
  bench.stage_threads`, 2026-12-05: 16 corpus requests of 1.3-2.3 s, median/p90 59/64 ms vs 69/74; requests of
  ~6 s 100/108 vs 131/138; two at once 115/120 vs 134/161 for both). Beside a Smart Turn check one thread lost
  (101 vs 76 ms): the audio check now runs after the work ahead (voice.listener.score_ahead). Over Whisper's full
  30 s window, before the fitted one, two threads won: 169 vs 187 ms.
So on two cores three jobs may run beside the engine: oversubscribed at full load, which the measurements favour
over fewer workers (and Whisper decodes queue inside CTranslate2, one at a time, whatever the threads). On larger
machines workers grow with the cores, not threads.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

JOB_THREADS = 2  # a synthesis's threads, and the unit the workers are counted in
ASR_THREADS = 1


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class ThreadBudget:
    cores: int
    engine: int  # the engine's OpenMP pool
    stage_workers: int  # shared-stage jobs that run at once
    asr: int  # CTranslate2 intra-op threads of one decode (its own `cpu_threads`)
    tts: int  # Piper's onnxruntime intra-op threads of one synthesis
    small: int = 1  # VAD and Smart Turn

    @classmethod
    def for_cores(cls, cores: int, stage_workers: int = 0) -> "ThreadBudget":
        """`stage_workers` 0: from the cores."""
        cores = max(1, cores)
        per_job = min(JOB_THREADS, cores)
        workers = stage_workers or max(3, cores // per_job + 1)
        return cls(cores=cores, engine=cores, stage_workers=workers, asr=min(ASR_THREADS, cores), tts=per_job)

    def engine_team(self, stage_jobs: int) -> int:
        """The engine's threads for its next step while `stage_jobs` recognitions, syntheses or turn checks run:
        the cores their threads leave, at least one. Each step of the engine's team meets a barrier per layer
        product; with more threads than cores a descheduled team thread holds up the rest at every one of them.
        (`bench.contention`, two cores, three replies decoding: beside one Whisper final a step took 16-27 ms with
        a team of two and 22-24 ms with a team of one, against 8 alone, and 9-10 finals a second ran beside the
        team of two against 14-15 beside the team of one; eight sessions of bench/load.py: v2v p95 1.3 s against
        1.7 s over 192 turns each.)
        """
        return max(1, self.engine - max(self.asr, self.tts) * max(0, stage_jobs))  # any of them may be a synthesis
