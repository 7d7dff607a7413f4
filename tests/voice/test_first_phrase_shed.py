"""When the preemptive first phrase is shed (voice.first_phrase.FirstPhrases.busy): the shared stages' recent waits,
their queued jobs, other sessions' engine requests. The signals are stand-ins here; the bench (bench.load) counts
the sheds of a real saturated server."""
from __future__ import annotations

from types import SimpleNamespace

from voice.first_phrase import FirstPhrases
from voice.llm_bridge import LlmBridge


class Runner:
    def __init__(self, wait_ms: float | None = None, depth: dict[str, int] | None = None) -> None:
        self.wait_ms = wait_ms
        self.stats = SimpleNamespace(depth=depth or {})

    def recent_wait_ms(self) -> float | None:
        return self.wait_ms


class Engine:
    """The engine's count of requests other sessions have in it."""

    def __init__(self, others: dict[str, int]) -> None:
        self.others = others

    def requests_besides(self, session_id: str) -> int:
        return sum(n for s, n in self.others.items() if s != session_id)


def phrases(runner: Runner, requests: dict[str, int]) -> FirstPhrases:
    stages = SimpleNamespace(runner=runner, llm=LlmBridge(Engine(requests)))
    return FirstPhrases(SimpleNamespace(stages=stages, session_id="me"), enabled=True, shed_wait_ms=50.0)  # type: ignore[arg-type]


def test_an_idle_machine_makes_the_phrase() -> None:
    assert phrases(Runner(wait_ms=12.0), {"me": 1}).busy() is None  # its own request (a reply ending) is no one else's


def test_waits_over_the_limit_shed_it() -> None:
    assert phrases(Runner(wait_ms=80.0), {}).busy() == "stage waits p95 80 ms"


def test_queued_stage_jobs_shed_it() -> None:
    assert phrases(Runner(depth={"waited": 0, "next": 2, "ahead": 1}), {}).busy() == "stage jobs queued"


def test_other_sessions_engine_requests_shed_it() -> None:
    assert phrases(Runner(), {"me": 1, "other": 2}).busy() == "2 engine requests of other sessions"


def test_preemptive_work_queued_alone_is_no_load() -> None:
    assert phrases(Runner(depth={"waited": 0, "ahead": 1}), {}).busy() is None
