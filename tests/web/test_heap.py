"""parley.heap: what start-up loaded is frozen out of later collections (a full collection then skips it), garbage
made later is still collected, and the collector's pauses are counted for /metrics."""
from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from bench import gc_pause
from parley import heap


@pytest.fixture
def unfrozen() -> Iterator[None]:
    yield
    gc.unfreeze()
    if heap.pauses() in gc.callbacks:
        gc.callbacks.remove(heap.pauses())


class _Node:
    pass


def test_loaded_objects_are_frozen_and_later_garbage_is_still_collected(unfrozen: None) -> None:
    loaded = [_Node() for _ in range(1000)]
    frozen = heap.freeze_loaded()
    assert frozen >= 1000
    # frozen: no collection sees them any more (the count itself can drop meanwhile: a frozen object another
    # thread frees leaves the permanent generation)
    collected = {id(o) for o in gc.get_objects()}
    assert not any(id(node) in collected for node in loaded)
    assert heap.freeze_loaded() >= frozen  # again: nothing breaks, the hook is not added twice
    assert gc.callbacks.count(heap.pauses()) == 1
    cycle = _Node()
    cycle.me = cycle  # type: ignore[attr-defined]  # garbage only a collection frees
    alive = weakref.ref(cycle)
    del cycle
    full_before = heap.pauses().count[2]
    gc.collect()
    assert alive() is None
    assert heap.pauses().count[2] == full_before + 1
    counters = heap.pauses().counters()
    assert counters["parley_gc_full_collections_total"][0] == full_before + 1
    assert counters["parley_gc_pause_seconds_total"][0] >= counters["parley_gc_full_pause_seconds_total"][0] > 0
    del loaded


def test_the_bench_measures_a_full_collection_before_and_after_freezing() -> None:
    r = gc_pause.measure(rounds=2, tiny=True)
    assert r["frozen"] >= 250_000 and r["tracked"] >= 250_000
    assert len(r["before_ms"]) == len(r["after_ms"]) == 2
    assert gc.get_freeze_count() == 0  # the bench leaves the process unfrozen
