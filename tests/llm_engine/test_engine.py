"""The threaded Engine on the embedded SmolLM2: cache reuse across turns, cancel, concurrency, slots, errors."""
from __future__ import annotations

import itertools
import math
import threading

import pytest
import torch

from llm_engine.engine import Engine
from llm_engine.generation import fit_messages
from llm_engine.kv_cache import common_prefix_len
from llm_engine.request import ChatMessage, ErrorEvent, FinishEvent, GenerateRequest, SamplingParams, TokenEvent

pytestmark = pytest.mark.slow

SYSTEM = ChatMessage("system", "You are a friendly assistant. Answer briefly.")


def ask(engine: Engine, session: str, msgs, max_new: int = 16, **sampling):
    return engine.submit(GenerateRequest(session, tuple(msgs), SamplingParams(max_new_tokens=max_new, **sampling))).collect()


@pytest.fixture
def small_engine(smol_engine):
    """A second engine on the same weights with few slots, to watch slots run out."""
    engine = Engine(smol_engine.model, smol_engine.tokenizer, max_slots=2, max_seq_len=256)
    engine.start()
    yield engine
    engine.stop()


@pytest.fixture
def cold_engine(smol_engine):
    """The same weights and cache type without the prefix cache across slots: every new session computes its
    whole prompt (the reference the cached runs must equal)."""
    engine = Engine(smol_engine.model, smol_engine.tokenizer, max_slots=2, max_seq_len=1024,
                    kv_dtype=smol_engine.cache.k.dtype, prefix_cache=False)  # fmt: skip
    engine.start()
    yield engine
    engine.stop()


def test_second_turn_reuses_cache_and_equals_a_fresh_full_prefill(smol_engine, cold_engine):
    turn1 = [SYSTEM, ChatMessage("user", "Name a fruit.")]
    ids1, text1, fin1 = ask(smol_engine, "reuse", turn1)
    assert fin1.timings.reused_tokens == 0
    # What the slot holds now: the prompt and every token fed back (a final sampled token never is).
    cached = smol_engine.tokenizer.apply_chat_template(turn1) + (ids1 if fin1.reason == "stop" else ids1[:-1])
    assert smol_engine.slots.slots[smol_engine.slots.slot_of("reuse")].tokens == cached

    turn2 = turn1 + [ChatMessage("assistant", text1), ChatMessage("user", "And a vegetable?")]
    full = smol_engine.tokenizer.apply_chat_template(turn2)
    again, _, fin2 = ask(smol_engine, "reuse", turn2)
    fresh, _, fin_fresh = ask(cold_engine, "fresh", turn2)

    assert again == fresh and len(again) >= 3
    reused = common_prefix_len(cached, full)
    assert reused >= len(smol_engine.tokenizer.apply_chat_template(turn1)) - 3  # the whole first turn, bar the gen prompt
    assert fin2.timings.reused_tokens == reused
    assert fin2.timings.prefill_tokens == len(full) - reused  # only the new tokens went through the model
    assert fin_fresh.timings.reused_tokens == 0 and fin_fresh.timings.prefill_tokens == len(full)
    smol_engine.release("reuse")


def test_prefill_only_request_prepares_the_cache_for_the_real_one(smol_engine, cold_engine):
    msgs = [SYSTEM, ChatMessage("user", "Tell me about the moon.")]
    ids, _, fin = ask(smol_engine, "ahead", msgs, max_new=0)
    assert ids == [] and fin.reason == "length" and fin.timings.prefill_tokens > 20
    full = smol_engine.tokenizer.apply_chat_template(msgs)
    ids, _, fin = ask(smol_engine, "ahead", msgs, max_new=8)
    assert fin.timings.reused_tokens == len(full) - 1 and fin.timings.prefill_tokens == 1
    assert ids == ask(cold_engine, "ahead-fresh", msgs, max_new=8)[0]
    smol_engine.release("ahead")


def test_a_one_token_prefill_runs_as_a_decode_step_with_the_same_first_token(smol_engine, cold_engine, monkeypatch):
    """The usual turn: the work ahead cached the prompt but its last token, which then runs through the engine's
    decode forward (the compiled step on CPU) instead of an eager prefill; the token it picks is the same."""
    msgs = [SYSTEM, ChatMessage("user", "Name a colour.")]
    ask(smol_engine, "one-token", msgs, max_new=0)
    calls = []
    decode = smol_engine.stepper.decode
    monkeypatch.setattr(smol_engine.stepper, "decode", lambda rows: calls.append(list(rows)) or decode(rows))
    ids, _, fin = ask(smol_engine, "one-token", msgs, max_new=1)
    assert fin.timings.prefill_tokens == 1 and fin.timings.decode_tokens == 0
    assert len(calls) == 1 and len(calls[0]) == 1  # the prefill's one forward, through the step
    assert ids == ask(cold_engine, "one-token-fresh", msgs, max_new=1)[0]
    smol_engine.release("one-token")


def test_a_request_s_own_stop_strings_end_it_and_are_not_part_of_the_text(smol_engine):
    msgs = [SYSTEM, ChatMessage("user", "Tell me about yourself.")]
    _, free, _ = ask(smol_engine, "stop-a", msgs, max_new=40)
    stop = " " + free.split()[5]  # greedy: the same text again, up to where this word first comes
    cut = free.index(stop)
    ids, text, fin = ask(smol_engine, "stop-b", msgs, max_new=40, stop=(stop,))
    assert fin.reason == "stop" and text == free[:cut] and len(ids) < 40
    for s in ("stop-a", "stop-b"):
        smol_engine.release(s)


def test_an_anonymous_request_continuing_another_s_conversation_reuses_its_cache(small_engine):
    turn1 = [SYSTEM, ChatMessage("user", "Name a fruit.")]
    shared = dict(max_new_tokens=8)

    def anon(name: str, msgs):
        req = GenerateRequest(name, tuple(msgs), SamplingParams(**shared), share_prefix=True)
        return small_engine.submit(req).collect()

    _, text1, fin1 = anon("http-1", turn1)
    assert fin1.timings.reused_tokens == 0
    turn2 = turn1 + [ChatMessage("assistant", text1), ChatMessage("user", "And a vegetable?")]
    _, _, fin2 = anon("http-2", turn2)  # another id: found by prefix, not by name
    assert fin2.timings.reused_tokens >= len(small_engine.tokenizer.apply_chat_template(turn1)) - 3
    _, _, fin3 = ask(small_engine, "a-session", turn2, max_new=8)  # a named session never takes a shared slot...
    assert small_engine.slots.slot_of("a-session") != small_engine.slots.slot_of("http-2")
    # ...it copies what http-2 computed (the whole prompt but its last token, which must run to pick the first)
    assert fin3.timings.reused_tokens == fin3.timings.shared_prefix_tokens == len(small_engine.tokenizer.apply_chat_template(turn2)) - 1


PERSONA = ChatMessage("system", "You are Juniper, the voice of a small bakery in the old town. " * 12
                      + "Answer in one or two short sentences, warmly, and never read out lists.")  # fmt: skip


def test_a_new_session_copies_the_persona_prefix_another_session_computed(smol_engine, cold_engine):
    """Same tokens as a cold prefill; the shared prefix (the persona's system prompt) is not computed again."""
    first = [PERSONA, ChatMessage("user", "When do you open?")]
    second = [PERSONA, ChatMessage("user", "Do you sell rye bread?")]
    hits, saved = smol_engine.prefix_hits, smol_engine.prefix_tokens
    ask(smol_engine, "guest-1", first)
    ids, _, fin = ask(smol_engine, "guest-2", second)
    cold_ids, _, cold = ask(cold_engine, "guest-2", second)

    tok = smol_engine.tokenizer
    prompt = tok.apply_chat_template(second)
    shared = common_prefix_len(tok.apply_chat_template(first), prompt)
    assert shared > 150  # the whole system prompt
    assert ids == cold_ids and len(ids) >= 3
    assert fin.timings.shared_prefix_tokens == fin.timings.reused_tokens == shared
    assert fin.timings.prefill_tokens == len(prompt) - shared
    assert cold.timings.reused_tokens == 0 and cold.timings.prefill_tokens == len(prompt)
    assert (smol_engine.prefix_hits, smol_engine.prefix_tokens) == (hits + 1, saved + shared)
    assert smol_engine.slots.slot_of("guest-1") != smol_engine.slots.slot_of("guest-2")
    # the donor keeps its own conversation: its next turn still reuses its whole cache
    _, _, again = ask(smol_engine, "guest-1", first)
    assert again.timings.reused_tokens == len(tok.apply_chat_template(first)) - 1 and again.timings.shared_prefix_tokens == 0
    for s in ("guest-1", "guest-2"):
        smol_engine.release(s)


def test_cancel_from_the_callback_stops_before_the_next_step_and_frees_the_slot(small_engine):
    holder: dict = {}
    seen: list = []

    def on_event(ev):
        seen.append((threading.current_thread().name, ev))
        if isinstance(ev, TokenEvent) and sum(isinstance(e, TokenEvent) for _, e in seen) == 3:
            holder["stream"].cancel()

    msgs = [SYSTEM, ChatMessage("user", "Write a long story about a dragon.")]
    holder["stream"] = small_engine.submit(GenerateRequest("c", tuple(msgs), SamplingParams(max_new_tokens=64)), on_event)
    ids, _, fin = holder["stream"].collect()
    assert len(ids) == 3 and fin.reason == "cancelled"
    assert {name for name, _ in seen} == {"llm-engine"}  # callbacks run on the engine thread
    slot = small_engine.slots.slot_of("c")
    assert not small_engine.slots.slots[slot].busy
    # The cache still holds what was computed, so the session keeps its prefix for the next turn.
    assert len(small_engine.slots.slots[slot].tokens) == len(small_engine.tokenizer.apply_chat_template(msgs)) + 2


def test_cancel_from_the_consumer_thread_allows_at_most_one_more_token(small_engine):
    engine_count = [0]

    def on_event(ev):
        engine_count[0] += isinstance(ev, TokenEvent)

    msgs = [SYSTEM, ChatMessage("user", "Count from one to fifty.")]
    stream = small_engine.submit(GenerateRequest("c2", tuple(msgs), SamplingParams(max_new_tokens=64)), on_event)
    got = 0
    for ev in stream:
        got += isinstance(ev, TokenEvent)
        if got == 2:
            produced_at_cancel = engine_count[0]
            stream.cancel()
        last = ev
    assert last.reason == "cancelled"
    assert engine_count[0] <= produced_at_cancel + 1
    # Two other sessions now fit in the two slots: nothing is still held by the cancelled request.
    assert ask(small_engine, "x", msgs, 2)[2].reason == "length"
    assert ask(small_engine, "y", msgs, 2)[2].reason == "length"
    assert small_engine.slots.slot_of("c2") is None  # evicted as least recently used


def test_eight_threads_give_the_same_outputs_as_sequential_runs(smol_engine):
    prompts = ["Name a color.", "Name an animal.", "Say hi.", "What is 2+2?", "Name a planet.", "Name a city.",
               "Name a sport.", "Name a tree."]  # fmt: skip
    msgs = {p: [SYSTEM, ChatMessage("user", p)] for p in prompts}
    sequential = {p: ask(smol_engine, f"seq{i}", msgs[p], 12)[0] for i, p in enumerate(prompts)}
    for i in range(8):
        smol_engine.release(f"seq{i}")

    results: dict = {}

    def worker(i: int, p: str) -> None:
        results[p] = ask(smol_engine, f"par{i}", msgs[p], 12)[0]

    threads = [threading.Thread(target=worker, args=(i, p)) for i, p in enumerate(prompts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert results == sequential
    assert smol_engine.active_slots() >= 8
    for i in range(8):
        smol_engine.release(f"par{i}")
    assert smol_engine.active_slots() == 0  # nothing leaked


def test_more_sessions_than_slots_queue_and_evict(small_engine):
    msgs = [SYSTEM, ChatMessage("user", "Name a bird.")]
    streams = [small_engine.submit(GenerateRequest(f"s{i}", tuple(msgs), SamplingParams(max_new_tokens=4))) for i in range(5)]
    outs = [s.collect() for s in streams]
    assert all(o[2].reason in ("length", "stop") for o in outs)
    assert len({tuple(o[0]) for o in outs}) == 1  # same prompt, same greedy tokens, whichever slot
    assert small_engine.active_slots() == 2


def test_same_seed_reproduces_sampled_reply(small_engine):
    msgs = [SYSTEM, ChatMessage("user", "Tell me a joke.")]
    kw = dict(temperature=0.9, top_k=40, top_p=0.95, repetition_penalty=1.1)
    a = ask(small_engine, "r1", msgs, 12, seed=5, **kw)[0]
    b = ask(small_engine, "r2", msgs, 12, seed=5, **kw)[0]
    assert a == b and len(a) >= 3


def test_errors_reach_the_caller_and_the_engine_lives_on(small_engine, monkeypatch):
    msgs = [SYSTEM, ChatMessage("user", "Hello?")]
    calls = {"n": 0}
    real_forward = small_engine.model.forward

    def broken(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("boom")
        return real_forward(*args, **kwargs)

    monkeypatch.setattr(small_engine.model, "forward", broken)
    events = list(small_engine.submit(GenerateRequest("e", tuple(msgs), SamplingParams(max_new_tokens=4))))
    assert isinstance(events[-1], ErrorEvent) and "boom" in events[-1].message
    ids, _, fin = ask(small_engine, "e", msgs, 4)
    assert isinstance(fin, FinishEvent) and fin.timings.reused_tokens == 0  # the half-written cache was dropped
    assert len(ids) == 4 or fin.reason == "stop"


def test_long_conversation_keeps_the_system_prompt_and_recent_turns(small_engine):
    history = [SYSTEM]
    for i in range(12):
        history += [ChatMessage("user", f"Fact number {i} is about the ocean and its waves."), ChatMessage("assistant", "Noted.")]
    history.append(ChatMessage("user", "Thanks. Say ok."))
    fitted = fit_messages(small_engine.tokenizer, history, 200)
    assert fitted is not None
    ids, kept = fitted
    assert len(ids) <= 200 and kept[0] == SYSTEM and kept[-1] == history[-1]
    assert kept[1].role == "user" and len(kept) < len(history)
    assert list(kept[1:]) == history[len(history) - len(kept) + 1 :]  # a contiguous run of the latest turns
    _, _, fin = ask(small_engine, "long", history, 8)
    assert fin.reason in ("stop", "length") and fin.timings.prefill_tokens <= 256


def test_prompt_that_cannot_fit_finishes_with_context(small_engine):
    msgs = [SYSTEM, ChatMessage("user", "word " * 400)]
    ids, _, fin = ask(small_engine, "huge", msgs, 8)
    assert ids == [] and fin.reason == "context"


def test_release_during_a_reply_cancels_it_and_frees_the_slot(small_engine):
    msgs = [SYSTEM, ChatMessage("user", "Write a poem about rain.")]
    stream = small_engine.submit(GenerateRequest("rel", tuple(msgs), SamplingParams(max_new_tokens=64)))
    events = iter(stream)
    assert isinstance(next(events), TokenEvent)
    before = small_engine.active_slots()
    small_engine.release("rel")  # returns at once, without waiting for the engine thread
    assert small_engine.active_slots() == before - 1
    assert [e for e in events if isinstance(e, FinishEvent)][0].reason == "cancelled"
    ask(small_engine, "after", msgs, 2)  # the engine serves the next session as usual
    assert small_engine.slots.slot_of("rel") is None


def test_from_path_with_int4_takes_the_gguf_q4_1_blocks_and_keeps_the_greedy_reply(smol_engine, smol_path):
    from llm_engine.quantize import Int4WeightOnlyLinear

    with pytest.raises(ValueError, match="quant"):
        Engine.from_path(smol_path, quant="int3")
    with pytest.raises(ValueError, match="kv cache dtype"):
        Engine.from_path(smol_path, kv_cache="int4")
    assert smol_engine.cache.k.dtype == torch.float16  # the CPU default for a float32 model
    quantized = Engine.from_path(smol_path, max_seq_len=256, max_slots=2, quant="int4", kv_cache="float32")
    full = Engine(smol_engine.model, smol_engine.tokenizer, max_seq_len=256, max_slots=1, kv_dtype=torch.float32)
    layers = [m for m in quantized.model.modules() if isinstance(m, Int4WeightOnlyLinear)]
    # Every projection, none left in float; fused per block into qkv, o, gate_up and down.
    assert len(layers) == 4 * quantized.model.cfg.num_layers
    assert not any(isinstance(m, torch.nn.Linear) for m in quantized.model.modules())
    msgs = [SYSTEM, ChatMessage("user", "Name three colours.")]
    quantized.start()
    full.start()
    try:
        ids = ask(quantized, "q", msgs, 12)[0]
        want = ask(full, "q-float", msgs, 12)[0]
    finally:
        quantized.stop()
        full.stop()
    assert len(ids) >= 3
    # Q4_1 with group 32 is our int4 layout: the same weights as the float model's dequantized ones, run by
    # other kernels (bfloat16 activations, an int8 head, each CPU's own instructions), so the logits differ by
    # rounding. The replies agree token for token, except that where the float model itself nearly ties
    # ("There" over "The" by 0.04 here) rounding may pick the other: the reply may part there and only there.
    prompt = full.tokenizer.apply_chat_template(msgs)
    common = next((i for i, (a, b) in enumerate(zip(ids, want)) if a != b), min(len(ids), len(want)))
    seq = prompt + want
    with torch.no_grad():
        at = torch.arange(len(seq))[None]
        float_logits = full.model(torch.tensor([seq]), at, full.cache, [0], logits_for="all")[0, len(prompt) - 1 : -1]
        int4_logits = quantized.model(torch.tensor([seq]), at, quantized.cache, [0], logits_for="all")[0, len(prompt) - 1 : -1]
    assert torch.nn.functional.cosine_similarity(float_logits, int4_logits, dim=-1).min() > 0.99
    if common < min(len(ids), len(want)):
        top2 = float_logits[common].topk(2).values
        assert float(top2[0] - top2[1]) < 0.5, (common, ids, want)  # parted only at a near-tie
    else:
        assert ids == want


def test_requests_queued_behind_their_sessions_running_one_all_run(smol_engine):
    """A session's second and third requests wait for its first (they share its cache), and run as soon as it
    ends, with nothing else arriving to wake the engine (this once left them queued forever)."""
    msgs = [SYSTEM, ChatMessage("user", "Name a colour.")]
    streams = [smol_engine.submit(GenerateRequest("queue", tuple(msgs), SamplingParams(max_new_tokens=n))) for n in (0, 0, 4)]
    done = threading.Event()
    results: list[object] = []
    threading.Thread(target=lambda: (results.extend(s.collect()[2] for s in streams), done.set()), daemon=True).start()
    assert done.wait(60), "a request queued behind its session's earlier one never ran"
    assert [type(r).__name__ for r in results] == ["FinishEvent"] * 3
    smol_engine.release("queue")


def test_fitting_a_long_history_renders_it_a_logarithmic_number_of_times(small_engine):
    """The cut is found by bisection (a linear search re-rendered the chat per dropped message: 300 messages took
    33 s of the engine thread), and it is the smallest cut that fits."""
    tok = small_engine.tokenizer
    history = [SYSTEM]
    for i in range(200):
        history += [ChatMessage("user", f"Fact number {i} is about the ocean."), ChatMessage("assistant", "Noted.")]
    history.append(ChatMessage("user", "Say ok."))
    renders = []

    class Counting:
        stop_ids = tok.stop_ids

        def apply_chat_template(self, msgs, **kwargs):  # (tools=..., as the engine passes them)
            renders.append(len(msgs))
            return tok.apply_chat_template(msgs, **kwargs)

    ids, kept = fit_messages(Counting(), history, 300)
    assert len(renders) <= 2 + math.ceil(math.log2(len(history)))
    assert len(ids) <= 300 and kept[0] == SYSTEM and kept[1].role == "user" and kept[-1] == history[-1]
    one_more = [SYSTEM, *history[len(history) - len(kept) - 1 :]]  # the turn before the cut, with its reply
    assert len(tok.apply_chat_template(one_more)) > 300


def test_each_step_runs_with_as_many_threads_as_share_cores_answers(smol_engine, monkeypatch):
    """share_cores: asked before every step, on the engine thread; the step's team (torch's count there, which the
    compiled step reads per call) follows the answers, at least one: fewer while other stages' jobs share the cores."""
    engine = Engine(smol_engine.model, smol_engine.tokenizer, max_slots=2, max_seq_len=256)
    answers, asked, seen = itertools.cycle([1, 2, 0, 3]), [], []

    def threads() -> int:
        n = next(answers)
        asked.append(max(1, n))
        return n

    engine.share_cores(threads)
    decode = engine.stepper.decode
    monkeypatch.setattr(engine.stepper, "decode", lambda rows: seen.append(torch.get_num_threads()) or decode(rows))
    engine.start()
    try:
        _, text, fin = ask(engine, "team", [SYSTEM, ChatMessage("user", "Count from one to ten.")], max_new=8)
    finally:
        engine.stop()
    assert isinstance(fin, FinishEvent) and fin.reason == "length" and text.strip()
    # step 1 runs the prompt (eager) and samples the first token; steps 2..8 each decode one through the stepper
    assert len(seen) == 7 and seen == asked[1:8], (asked, seen)
    assert set(seen) == {1, 2, 3}
