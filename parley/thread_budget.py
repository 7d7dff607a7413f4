"""How many threads each CPU stage may use, sized together from the cores this process may run on, instead of
each library assuming the whole machine (CTranslate2 and onnxruntime default to every core, and so does the
engine's OpenMP pool).

- engine: every core the running stage jobs leave (engine_team, asked before each step: a team thread that
  shares a core with a stage job's holds up the step at every barrier). It is what a user waits on most.
- stage_workers: how many recognitions, syntheses and turn checks run at once (voice.scheduler): one more than
  the cores, at least three, so that while a partial and a later phrase run, a final transcript, a turn check or
  a first phrase still finds a worker (voice.stage_queue keeps one for them).
- per job: two intra-op threads for recognition and synthesis (measured on the 2-core dev machine, Whisper
  tiny.en on 2 s requests: one at a time 169 ms with 2 threads vs 187 with 1; two at once 353 vs 431 ms for
  both), one for the VAD and the Smart Turn check (small models, ~1-30 ms).
So on two cores three jobs of two threads each may run beside the engine: oversubscribed at full load, which
the measurement above favours over one thread each (and Whisper decodes queue inside CTranslate2, one at a time,
whatever the threads). On larger machines workers grow with the cores, not threads.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

JOB_THREADS = 2


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
    asr: int  # CTranslate2 intra-op threads of one decode
    tts: int  # Piper's onnxruntime intra-op threads of one synthesis
    small: int = 1  # VAD and Smart Turn

    @classmethod
    def for_cores(cls, cores: int, stage_workers: int = 0) -> "ThreadBudget":
        """`stage_workers` 0: from the cores."""
        cores = max(1, cores)
        per_job = min(JOB_THREADS, cores)
        workers = stage_workers or max(3, cores // per_job + 1)
        return cls(cores=cores, engine=cores, stage_workers=workers, asr=per_job, tts=per_job)

    def engine_team(self, stage_jobs: int) -> int:
        """The engine's threads for its next step while `stage_jobs` recognitions, syntheses or turn checks run:
        the cores their threads leave, at least one. Each step of the engine's team meets a barrier per layer
        product; with more threads than cores a descheduled team thread holds up the rest at every one of them.
        (`bench.contention`, two cores, three replies decoding: beside one Whisper final a step took 16-27 ms with
        a team of two and 22-24 ms with a team of one, against 8 alone, and 9-10 finals a second ran beside the
        team of two against 14-15 beside the team of one; eight sessions of bench/load.py: v2v p95 1.3 s against
        1.7 s over 192 turns each.)
        """
        return max(1, self.engine - self.asr * max(0, stage_jobs))
