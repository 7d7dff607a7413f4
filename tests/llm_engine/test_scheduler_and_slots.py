"""Pure cores: round-robin scheduling policy, slot ownership with LRU eviction, the static cache's indexing."""
from __future__ import annotations

import torch

from llm_engine.kv_cache import SlotTable, StaticKVCache, common_prefix_len
from llm_engine.scheduler import RoundRobinScheduler


def test_round_robin_over_running_jobs_in_fifo_admission_order():
    s = RoundRobinScheduler()
    for j in (1, 2, 3):
        s.enqueue(j)
    assert s.queued() == [1, 2, 3]
    s.start(1)
    s.start(2)
    assert [s.next_step() for _ in range(4)] == [1, 2, 1, 2]
    s.start(3)
    assert [s.next_step() for _ in range(3)] == [3, 1, 2]
    s.remove(1)  # a finished job leaves without skipping anyone's turn
    assert [s.next_step() for _ in range(3)] == [3, 2, 3]
    s.remove(2)
    s.remove(3)
    assert s.next_step() is None


def test_slot_is_kept_by_its_session_and_lru_idle_slot_is_evicted():
    t = SlotTable(2)
    a = t.acquire("a")
    t.slots[a].tokens = [1, 2, 3]
    t.finish(a)
    b = t.acquire("b")
    assert b != a
    t.finish(b)
    assert t.acquire("a") == a and t.slots[a].tokens == [1, 2, 3]  # same session, cache kept
    t.finish(a)
    c = t.acquire("c")  # full: "b" was used least recently
    assert c == b and t.slots[c].tokens == [] and t.slot_of("b") is None
    assert t.acquire("d") == a  # "a" is idle, "c" busy: "a" goes
    assert t.acquire("e") is None  # both busy: the request must queue
    assert t.owned() == 2


def test_busy_slots_are_never_evicted_and_release_frees():
    t = SlotTable(1)
    assert t.acquire("a") == 0
    assert t.acquire("b") is None
    assert t.release("a") is False  # busy: the engine frees it when the request ends
    t.finish(0)
    assert t.release("a") is True and t.owned() == 0
    assert t.acquire("b") == 0


def test_common_prefix_len():
    assert common_prefix_len([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix_len([], [1]) == 0
    assert common_prefix_len([1, 2], [1, 2]) == 2


def test_cache_write_read_per_slot_and_position():
    cache = StaticKVCache(num_layers=2, num_slots=3, num_kv_heads=2, max_seq_len=8, head_dim=4)
    k = torch.arange(2 * 3 * 4, dtype=torch.float32).view(1, 2, 3, 4)  # [B=1, Hkv, T=3, D]
    cache.write(1, [2], torch.tensor([[2, 3, 4]]), k, -k)
    keys, values = cache.read(1, [2], 5)
    assert keys.shape == (1, 2, 5, 4)
    assert torch.equal(keys[0, :, 2:5], k[0]) and torch.equal(values[0, :, 2:5], -k[0])
    assert cache.k[0].abs().sum() == 0 and cache.k[1, :2].abs().sum() == 0  # nothing else touched
    # Batched write: two slots at different positions in one call.
    kb = torch.ones(2, 2, 1, 4)
    kb[1] *= 2
    cache.write(0, [0, 1], torch.tensor([[3], [6]]), kb, kb)
    keys, _ = cache.read(0, [0, 1], 7)
    assert keys[0, :, 3].eq(1).all() and keys[1, :, 6].eq(2).all() and keys.sum() == 2 * 4 * (1 + 2)
