"""Admission from committed work (web.capacity) on scripted loads: measured sessions count what they cost, so the
ninth heavy session is refused and the eighth is not, while light ones leave room; a refusal says when to retry."""
from __future__ import annotations

import pytest

from web.capacity import CostModel, LoadMeter

HEAVY = 0.25  # cores a heavy session keeps busy (on 2 cores, the bench's eight)


class Load:
    """Sessions whose busy core-seconds grow at a scripted rate, observed once a second."""

    def __init__(self, model: CostModel) -> None:
        self.model, self.meter = model, LoadMeter(tau_s=model.tau_s)
        self.rate: dict[str, float] = {}
        self.busy: dict[str, float] = {}
        self.now_s = 0.0

    def run(self, seconds: int) -> dict[str, float | None]:
        loads = self.meter.observe(self.busy, self.now_s)
        for _ in range(seconds):
            self.now_s += 1.0
            for key, rate in self.rate.items():
                self.busy[key] += rate
            loads = self.meter.observe(self.busy, self.now_s)
        return loads

    def join(self, key: str, rate: float) -> bool:
        """A newcomer asks; admitted (and working at `rate` from now on) unless the model refuses."""
        if self.model.refusal(self.run(0)) is not None:
            return False
        self.rate[key], self.busy[key] = rate, 0.0
        return True


def test_the_ninth_heavy_session_is_refused_and_the_eighth_is_not() -> None:
    load = Load(CostModel(cores=2.0, session_cores=HEAVY))
    for i in range(8):
        assert load.join(f"heavy-{i}", HEAVY), f"session {i + 1} refused"
        load.run(5)  # it talks a while: measured
    loads = load.run(30)
    assert all(v == pytest.approx(HEAVY, rel=0.02) for v in loads.values())
    refusal = load.model.refusal(loads)
    assert refusal is not None and "8 sessions here keep 2.00 of 2 cores busy" in refusal.reason
    assert 1000 <= refusal.retry_after_ms <= 60_000
    assert not load.join("heavy-8", HEAVY)
    del load.rate["heavy-0"], load.busy["heavy-0"]  # one leaves: room again at once
    assert load.join("heavy-8", HEAVY)


def test_light_sessions_leave_room_that_a_count_would_not() -> None:
    load = Load(CostModel(cores=2.0, session_cores=HEAVY))
    admitted = 0
    for i in range(16):
        if load.join(f"listener-{i}", 0.05):
            admitted += 1
        load.run(5)
    assert admitted >= 12  # listeners cost a fifth of a talker: far more than eight fit
    loads = load.run(20)
    assert load.model.committed(loads) <= 2.0


def test_a_burst_of_unmeasured_arrivals_counts_each_as_heavy() -> None:
    model = CostModel(cores=2.0, session_cores=HEAVY)
    meter = LoadMeter()
    busy: dict[str, float] = {}
    admitted = 0
    for i in range(12):  # all within the same second: nothing is measured yet
        if model.refusal(meter.observe(busy, 0.5)) is None:
            busy[f"s{i}"] = 0.0
            admitted += 1
    assert admitted == 8
    assert model.refusal({}) is None  # an empty server always takes one


def test_wall_time_that_a_shared_core_stretched_is_scaled_down_to_the_cpu_the_process_used() -> None:
    # Eight sessions whose jobs' wall time says 0.3 cores each (2.4: "full"), while the process used 1.6 cores of CPU:
    # the jobs waited for cores, they did not work. Their loads are scaled to what they used, and one more fits.
    meter, model = LoadMeter(tau_s=10.0), CostModel(cores=2.0, session_cores=HEAVY)
    busy = {f"s{i}": 0.0 for i in range(8)}
    cpu = 0.0
    for t in range(1, 40):
        busy = {k: v + 0.3 for k, v in busy.items()}
        cpu += 1.6
        loads = meter.observe(busy, float(t), cpu)
    assert meter.scale == pytest.approx(1.6 / 2.4, rel=0.02)
    assert model.committed(loads) == pytest.approx(1.6, rel=0.02) and model.refusal(loads) is None
    unscaled = LoadMeter(tau_s=10.0)
    for t in range(40):  # the same sessions without the process's CPU time: refused, as before
        loads = unscaled.observe({k: 0.3 * t for k in busy}, float(t))
    assert model.refusal(loads) is not None
    used_more = LoadMeter(tau_s=10.0)  # the process used more than the jobs' wall time (threads inside a job): never scaled up
    for t in range(40):
        loads = used_more.observe({k: 0.2 * t for k in busy}, float(t), 2.0 * t)
    assert used_more.scale == 1.0 and model.committed(loads) == pytest.approx(1.6, rel=0.02)


def test_a_newcomer_is_priced_as_the_sessions_here_never_above_a_heavy_one() -> None:
    model = CostModel(cores=2.0, session_cores=HEAVY)
    assert model.newcomer({}) == HEAVY and model.newcomer({"a": None}) == HEAVY  # nothing measured: heavy
    listeners = {f"u{i}": 0.12 for i in range(15)}  # 1.80 cores: a heavy newcomer (0.25) would not fit, one of them does
    assert model.newcomer(listeners) == pytest.approx(0.12)
    assert model.refusal(listeners) is None
    refusal = model.refusal({**listeners, "u15": 0.12})  # 1.92 + 0.12 > 2
    assert refusal is not None and "another (~0.12)" in refusal.reason
    assert model.newcomer({"a": 0.6, "b": 0.4}) == HEAVY  # heavier than heavy: still a heavy one


def test_sessions_not_measured_yet_still_count_as_heavy_among_light_ones() -> None:
    # Priced at the average instead, a burst of arrivals among listeners overshot (bench.load --churn --seed 2:
    # p95 1.85 s, three replies stalling): until its first 2 s are measured, a newcomer may be a talker.
    model = CostModel(cores=2.0, session_cores=HEAVY)
    loads: dict[str, float | None] = {**{f"u{i}": 0.1 for i in range(14)}, "new1": None, "new2": None, "new3": None}
    assert model.committed(loads) == pytest.approx(1.4 + 3 * HEAVY)  # at the average it would be 1.7: room for more
    assert model.refusal(loads) is not None


def test_sessions_that_fill_the_engine_are_refused_while_the_cores_have_room() -> None:
    # A model whose steps cost more (the 0.5B default under churn): the sessions' core loads leave room, but the
    # engine, one serial resource, is busy 78% of the time; a newcomer at their average (6.5%) passes the 80% it may fill.
    model = CostModel(cores=2.0, session_cores=HEAVY, engine_share=0.8)
    cores = {f"u{i}": 0.1 for i in range(12)}  # 1.2 of 2 cores
    engine = {f"u{i}": 0.065 for i in range(12)}
    refusal = model.refusal(cores, engine)
    assert refusal is not None and "language model busy 78% of the time" in refusal.reason
    assert "another (~6%)" in refusal.reason or "another (~7%)" in refusal.reason
    assert 1000 <= refusal.retry_after_ms <= 60_000
    assert model.refusal(cores) is None  # the cores alone: room
    assert CostModel(cores=2.0, session_cores=HEAVY).refusal(cores, engine) is None  # engine not priced apart: room
    lighter = {k: 0.05 for k in engine}  # 60% + 5%: fits
    assert model.refusal(cores, lighter) is None


def test_unmeasured_sessions_count_as_a_heavy_part_of_the_engine() -> None:
    # A heavy session's part of the engine is its part of the cores (1/8 of what each may fill): a burst of
    # unmeasured arrivals stops at the same eight whichever resource counts it.
    model = CostModel(cores=2.0, session_cores=HEAVY, engine_share=0.8)
    assert model.session_engine == pytest.approx(0.1)
    engine_meter, core_meter = LoadMeter(), LoadMeter()
    busy: dict[str, float] = {}
    admitted = 0
    for i in range(12):
        if model.refusal(core_meter.observe(busy, 0.5), engine_meter.observe(busy, 0.5)) is None:
            busy[f"s{i}"] = 0.0
            admitted += 1
    assert admitted == 8
    assert model.committed_engine({"a": None, "b": 0.3}) == pytest.approx(0.4)


def test_a_burst_of_unmeasured_arrivals_stops_where_the_calibrated_engine_is_full() -> None:
    # parley.runtime.calibrate_engine timed the 0.5B's turns at ~16% of the engine on two cores: a burst of arrivals
    # (nothing measured yet) is priced at that, and stops at three where the cores' heavy price would take eight.
    model = CostModel(cores=2.0, session_cores=HEAVY, engine_share=0.5, heavy_engine=0.16)
    assert model.session_engine == 0.16
    engine_meter, core_meter = LoadMeter(), LoadMeter()
    busy: dict[str, float] = {}
    for i in range(8):
        refusal = model.refusal(core_meter.observe(busy, 0.5), engine_meter.observe(busy, 0.5))
        if refusal is not None:
            break
        busy[f"s{i}"] = 0.0
    assert len(busy) == 3 and refusal is not None and "language model busy 48% of the time" in refusal.reason
    # the 135M on the same machine (~4%): twelve before the engine is full, so the cores' price (eight) decides
    light = CostModel(cores=2.0, session_cores=HEAVY, engine_share=0.5, heavy_engine=0.04)
    assert light.refusal({f"s{i}": None for i in range(7)}, {f"s{i}": None for i in range(7)}) is None
    assert light.refusal({f"s{i}": None for i in range(8)}, {f"s{i}": None for i in range(8)}) is not None
    # measured sessions count as what they cost, calibrated or not
    assert model.committed_engine({"a": None, "b": 0.05}) == pytest.approx(0.21)
