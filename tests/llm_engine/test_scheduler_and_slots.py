"""Pure cores: the continuous-batching scheduler policy, slot ownership with LRU eviction, the static cache's indexing."""
from __future__ import annotations

import pytest
import torch

from llm_engine.kv_cache import SlotTable, StaticKVCache, common_prefix_len
from llm_engine.prepare import resolve_kv_dtype
from llm_engine.scheduler import MIN_CHUNK_TOKENS, BatchScheduler, ChunkPace, StepPlan


def test_fifo_admission_and_one_batched_decode_of_everyone_past_prefill():
    s = BatchScheduler(max_batch=3, chunk_tokens=16, solo_chunk_tokens=64)
    for j in (1, 2, 3, 4):
        s.enqueue(j)
    assert s.queued() == [1, 2, 3, 4]
    assert s.plan() == StepPlan(None, 0, ())  # nothing admitted, nothing to run
    s.start(1)
    s.start(2)
    assert s.plan() == StepPlan(1, 64, ())  # nobody decodes yet: the big chunk
    s.prefill_done(1)
    assert s.plan() == StepPlan(2, 16, (1,))  # 1 decodes: 2's prompt comes in small chunks beside it
    s.start(3)
    assert not s.has_room()
    with pytest.raises(RuntimeError):
        s.start(4)  # the batch is bounded
    assert s.plan().prefill == 2  # no chunk ran yet (chunk_ran): ties go to the earliest admitted
    s.prefill_done(2)
    assert s.plan() == StepPlan(3, 16, (1, 2))
    s.prefill_done(3)
    assert s.plan() == StepPlan(None, 0, (1, 2, 3))
    assert s.running() == [1, 2, 3] and s.decoding() == [1, 2, 3]
    s.remove(2)  # finished or cancelled: the others keep decoding
    assert s.plan().decode == (1, 3) and s.has_room()
    s.start(4)
    assert s.queued() == [] and s.plan() == StepPlan(4, 16, (1, 3))
    s.remove(4)  # cancelled during its prefill
    s.remove(1)
    s.remove(3)
    assert s.plan() == StepPlan(None, 0, ()) and s.running() == []


def test_scheduler_rejects_nonsense_bounds():
    with pytest.raises(ValueError):
        BatchScheduler(max_batch=0)
    with pytest.raises(ValueError):
        BatchScheduler(max_batch=2, chunk_tokens=64, solo_chunk_tokens=32)


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


def test_a_float16_cache_stores_a_float32_models_keys_rounded():
    cache = StaticKVCache(num_layers=1, num_slots=3, num_kv_heads=2, max_seq_len=8, head_dim=4, dtype=torch.float16)
    k = torch.randn(2, 2, 1, 4) / 3  # values float16 cannot hold exactly
    cache.write(0, [0, 2], torch.tensor([[3], [5]]), k, -k)  # the batched (index_put) path
    cache.write(0, [1], torch.tensor([[1, 2]]), k[:1].expand(1, 2, 2, 4), k[:1].expand(1, 2, 2, 4))  # the slice path
    keys, values = cache.read(0, [0, 2], 6)
    assert keys.dtype == torch.float16
    assert torch.equal(keys[0, :, 3], k[0, :, 0].half()) and torch.equal(values[1, :, 5], -k[1, :, 0].half())
    assert torch.equal(cache.k[0, 1, :, 2], k[0, :, 0].half())


def test_kv_dtype_auto_halves_only_a_float32_model_on_cpu():
    assert resolve_kv_dtype("auto", torch.float32, "cpu") == torch.float16
    assert resolve_kv_dtype("auto", torch.float32, "cuda") == torch.float32
    assert resolve_kv_dtype("auto", torch.bfloat16, "cpu") == torch.bfloat16
    assert resolve_kv_dtype("float32", torch.float32, "cpu") == torch.float32
    assert resolve_kv_dtype("bfloat16", torch.float32, "cuda") == torch.bfloat16
    assert resolve_kv_dtype("int8", torch.float32, "cpu") == torch.int8
    with pytest.raises(ValueError, match="kv cache dtype"):
        resolve_kv_dtype("int4", torch.float32, "cpu")


def test_a_held_job_sits_steps_out_and_keeps_its_place():
    s = BatchScheduler(max_batch=3, chunk_tokens=16, solo_chunk_tokens=64)
    for j in (1, 2, 3):
        s.enqueue(j)
        s.start(j)
    s.prefill_done(1)
    s.hold(1, True)
    s.hold(2, True)  # held during its prompt: the next admitted prompt gets the chunk
    assert s.plan() == StepPlan(3, 64, ()) and s.runnable()
    s.prefill_done(3)
    assert s.plan() == StepPlan(None, 0, (3,))
    s.hold(3, True)
    assert not s.runnable() and s.plan() == StepPlan(None, 0, ()) and s.running() == [2, 1, 3]
    s.hold(1, False)
    s.hold(2, False)
    assert s.plan() == StepPlan(2, 16, (1,)) and s.runnable()
    s.remove(3)
    s.hold(3, True)  # gone: a late hold is ignored
    assert s.plan().decode == (1,)


def test_an_anonymous_request_takes_over_the_shared_slot_with_the_longest_common_prefix():
    t = SlotTable(3)
    own = t.acquire("voice")  # a session's slot: never taken by prefix, however much it shares
    t.slots[own].tokens = [1, 2, 3, 4, 5]
    t.finish(own)
    a = t.acquire("anon-1", [1, 2, 9], shared=True)
    t.slots[a].tokens = [1, 2, 9, 9]
    t.finish(a)
    b = t.acquire("anon-2", [7, 7], shared=True)  # shares nothing with anyone: a free slot
    assert b not in (own, a) and t.slots[b].tokens == []
    t.slots[b].tokens = [7, 7, 8]
    t.finish(b)
    c = t.acquire("anon-3", [1, 2, 9, 9, 4], shared=True)  # continues anon-1's conversation
    assert c == a and t.slots[c].tokens == [1, 2, 9, 9] and t.slot_of("anon-1") is None and t.slots[c].shared
    assert t.acquire("anon-4", [7, 7, 8, 1], shared=True) == b
    # "voice" shares the most, but is not shared: it is only evicted as the least recently used, its cache dropped
    assert t.acquire("anon-5", [1, 2, 3, 4, 5, 6], shared=True) == own and t.slots[own].tokens == []


def test_the_prefix_donor_is_the_idle_slot_sharing_the_most_beyond_what_the_slot_holds():
    t = SlotTable(4)
    persona = list(range(100, 140))  # 40 tokens: a system prompt every session starts with
    a, b = t.acquire("a"), t.acquire("b")
    t.slots[a].tokens, t.slots[b].tokens = persona + [1, 2], persona[:20]
    t.finish(a)
    c = t.acquire("c")
    assert t.prefix_donor(c, persona + [7]) == (a, 40)  # b is busy, and a shares more anyway
    assert t.slots[a].last_used > t.slots[b].last_used  # a donor counts as used: the shared prefix stays longest
    t.finish(b)
    assert t.prefix_donor(c, persona[:10]) is None  # under MIN_SHARED_PREFIX tokens: not worth a copy
    t.slots[c].tokens = persona[:30]
    assert t.prefix_donor(c, persona, min_tokens=16) is None  # a adds only 10 tokens to what c holds
    assert t.prefix_donor(c, persona, min_tokens=8) == (a, 40)


def test_copy_prefix_copies_every_layer_of_the_first_positions_only():
    cache = StaticKVCache(num_layers=2, num_slots=2, num_kv_heads=1, max_seq_len=8, head_dim=2)
    cache.k.normal_()
    cache.v.normal_()
    before = cache.k[:, 1].clone()
    cache.copy_prefix(0, 1, 5)
    assert torch.equal(cache.k[:, 1, :, :5], cache.k[:, 0, :, :5]) and torch.equal(cache.v[:, 1, :, :5], cache.v[:, 0, :, :5])
    assert torch.equal(cache.k[:, 1, :, 5:], before[:, :, 5:])


def test_prompt_chunks_go_round_robin_by_session_so_two_sessions_prompts_interleave():
    s = BatchScheduler(max_batch=4, chunk_tokens=16, solo_chunk_tokens=64)
    s.enqueue(1, "bomber")  # a long prompt admitted first ...
    s.enqueue(2, "bystander")  # ... then a bystander's
    s.start(1)
    s.start(2)
    ran = []
    for _ in range(6):
        job = s.plan().prefill
        assert job is not None
        ran.append(job)
        s.chunk_ran(job)
    assert ran == [1, 2, 1, 2, 1, 2]  # not 1, 1, 1, ... until the bomber's prompt is through
    s.prefill_done(2)  # the bystander's first token is out
    assert s.plan() == StepPlan(1, 16, (2,))
    s.chunk_ran(1)
    s.remove(1)  # the bomber's request ends; its next one is queued at once ...
    s.enqueue(3, "bystander")  # (after the bystander's next question)
    s.enqueue(4, "bomber")
    s.remove(2)
    s.start(3)
    s.start(4)
    assert s.plan().prefill == 3  # ... and it does not jump the turn: the bystander's session ran its chunk longer ago
    s.chunk_ran(3)
    assert s.plan().prefill == 4


def test_a_session_of_its_own_per_job_when_none_is_given_and_held_jobs_give_their_turn_away():
    s = BatchScheduler(max_batch=3, chunk_tokens=16, solo_chunk_tokens=64)
    for j in (1, 2, 3):
        s.enqueue(j)
        s.start(j)
    s.hold(1, True)
    order = []
    for _ in range(4):
        job = s.plan().prefill
        order.append(job)
        s.chunk_ran(job)
    assert order == [2, 3, 2, 3]  # 1 is held: it keeps its place but sits out
    s.hold(1, False)
    assert s.plan().prefill == 1  # released: its chunk ran longest ago (never)


def test_chunks_beside_decoding_are_paced_to_a_time_budget() -> None:
    # A model whose prompt costs ~8 ms a token: 128 tokens would stall every decoding reply for ~1 s.
    pace = ChunkPace(150.0, 128)
    assert pace.tokens() == 128  # nothing measured yet: the cap
    pace.observe(128, 5000.0)  # the first chunk pays the first-call costs: not counted
    assert pace.tokens() == 128
    pace.observe(128, 1024.0)
    assert pace.tokens() == 18  # 150 ms at 8 ms a token
    for _ in range(20):
        pace.observe(18, 18 * 2.0)  # the machine got faster (or the chunks cheaper): the average follows
    assert 60 <= pace.tokens() <= 80
    pace.observe(3, 300.0)  # a short chunk's fixed cost says nothing of the model's cost a token
    assert 60 <= pace.tokens() <= 80
    fast = ChunkPace(150.0, 128)
    fast.observe(128, 100.0)
    fast.observe(128, 100.0)  # SmolLM2-135M's speed: the cap holds
    assert fast.tokens() == 128
    slow = ChunkPace(150.0, 128)
    slow.observe(64, 64 * 100.0)
    slow.observe(64, 64 * 100.0)  # whatever the cost, a chunk still makes progress
    assert slow.tokens() == MIN_CHUNK_TOKENS
    assert ChunkPace(150.0, 4).tokens() == 4 and ChunkPace(0.0, 128).tokens() == 128


def test_a_background_prompt_runs_after_every_other_and_in_small_chunks_even_alone():
    s = BatchScheduler(max_batch=4, chunk_tokens=64, solo_chunk_tokens=512)
    s.enqueue(1, "conv/summary", background=True)
    s.start(1)
    assert s.plan() == StepPlan(1, 64, ())  # alone, yet a small chunk: a request arriving waits one chunk at most
    s.enqueue(2, "conv")
    s.start(2)
    assert s.plan() == StepPlan(2, 512, ())  # the user's prompt first, at full size, though the summary's is older
    s.prefill_done(2)
    assert s.plan() == StepPlan(1, 64, (2,))  # then the background chunk beside the decode
    s.remove(1)
    s.remove(2)
    s.enqueue(3, "other")
    s.start(3)
    assert s.plan() == StepPlan(3, 512, ())  # a foreground prompt alone takes the full chunk again
