"""Continuous batching: batched decode equals solo runs token for token, cancel inside a batch, late joiners, no starvation.

Most tests drive an unstarted Engine step by step (engine.step()) on a tiny random model with the embedded
tokenizer, so they count steps instead of time; one runs the embedded SmolLM2 itself.
"""
from __future__ import annotations

import math

import pytest

from llm_engine.engine import Engine, EngineStream
from llm_engine.fuse import fuse_projections
from llm_engine.model import Transformer
from llm_engine.request import ChatMessage, FinishEvent, GenerateRequest, SamplingParams, TokenEvent
from llm_engine.tokenizer import Tokenizer

SYSTEM = ChatMessage("system", "You are terse.")
CHUNK = 32  # small prompt chunks so a few hundred prompt tokens take several steps

# Four requests with different prompts, lengths and sampling settings (two of them seeded draws).
FOUR = (
    ("a", "Name a fruit.", SamplingParams(max_new_tokens=20)),
    ("b", "Tell me a very long story about dragons, castles, knights, a river and a lost map " * 3,
     SamplingParams(max_new_tokens=12, repetition_penalty=1.3)),
    ("c", "Hi.", SamplingParams(max_new_tokens=25, temperature=0.8, top_k=50, seed=7)),
    ("d", "What is two plus two, and why?", SamplingParams(max_new_tokens=16, temperature=1.1, top_p=0.9, seed=11)),
)  # fmt: skip


@pytest.fixture(scope="module")
def tokenizer(smol_tokenizer) -> Tokenizer:
    return smol_tokenizer


@pytest.fixture(scope="module", params=["torch", "compiled"])
def tiny(request, tiny_chat_model) -> Transformer:
    """The same random model decoded by PyTorch, and (projections fused) by the compiled CPU step."""
    model = tiny_chat_model(0, 1024)
    return fuse_projections(model) if request.param == "compiled" else model


def make_engine(model: Transformer, tokenizer: Tokenizer, slots: int) -> Engine:
    native = "on" if model.layers[0].self_attn.qkv_proj is not None else "off"
    return Engine(model, tokenizer, max_slots=slots, max_seq_len=1024, prefill_chunk=CHUNK, native=native)


def request(session: str, text: str, sampling: SamplingParams) -> GenerateRequest:
    return GenerateRequest(session, (SYSTEM, ChatMessage("user", text)), sampling)


class Recorder:
    """Submits requests and notes, per request, the engine step at which each of its tokens came out."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.token_steps: dict[str, list[int]] = {}
        self.streams: dict[str, EngineStream] = {}
        self.finished: set[str] = set()
        self.batch_sizes: list[int] = []

    def submit(self, session: str, text: str, sampling: SamplingParams) -> EngineStream:
        self.token_steps[session] = []

        def on_event(ev: object) -> None:
            if isinstance(ev, TokenEvent):
                self.token_steps[session].append(self.engine.steps)
            elif isinstance(ev, FinishEvent):
                self.finished.add(session)

        self.streams[session] = self.engine.submit(request(session, text, sampling), on_event)
        return self.streams[session]

    def step(self, n: int = 1) -> None:
        for _ in range(n):
            plan = self.engine.step()
            assert plan is not None, "the engine had nothing to do"
            self.batch_sizes.append(len(plan.decode))

    def run_until_done(self, limit: int = 2000) -> None:
        while len(self.finished) < len(self.streams):
            self.step()
            limit -= 1
            assert limit > 0

    def results(self) -> dict[str, tuple[list[int], str]]:
        out = {}
        for s, stream in self.streams.items():
            ids, _, last = stream.collect()
            out[s] = (ids, last.reason)
        return out


@pytest.fixture(scope="module")
def solo(tiny, tokenizer) -> dict[str, tuple[list[int], str]]:
    """Each of FOUR run alone on a fresh engine: the reference the batched runs must equal."""
    out = {}
    for session, text, sampling in FOUR:
        rec = Recorder(make_engine(tiny, tokenizer, 1))
        rec.submit(session, text, sampling)
        rec.run_until_done()
        assert max(rec.batch_sizes) <= 1
        out.update(rec.results())
    assert all(len(ids) >= 5 for ids, _ in out.values())
    return out


def test_four_requests_decoded_in_one_batch_equal_each_run_alone(tiny, tokenizer, solo):
    rec = Recorder(make_engine(tiny, tokenizer, 4))
    for session, text, sampling in FOUR:
        rec.submit(session, text, sampling)
    rec.run_until_done()
    assert rec.results() == solo  # greedy and seeded draws alike, token for token, same finish reasons
    assert max(rec.batch_sizes) == 4  # they really shared decode forwards
    assert sum(size == 4 for size in rec.batch_sizes) >= 5
    assert rec.engine.active_slots() == 4 and not any(s.busy for s in rec.engine.slots.slots)


def test_cancel_inside_a_batch_frees_its_slot_at_once_and_leaves_the_others_intact(tiny, tokenizer, solo):
    engine = make_engine(tiny, tokenizer, 4)
    rec = Recorder(engine)
    for session, text, sampling in FOUR:
        rec.submit(session, text, sampling)
    while len(rec.token_steps["c"]) < 4 or engine.scheduler.plan().prefill is not None:
        rec.step()
    slot = engine.slots.slot_of("c")
    got = len(rec.token_steps["c"])
    rec.streams["c"].cancel()
    rec.step()  # the cancel is taken before this step's forward
    assert not engine.slots.slots[slot].busy and sorted(engine.scheduler.decoding()) == [1, 2, 4]
    assert rec.batch_sizes[-1] == 3
    # The freed slot goes to a newcomer right away (LRU: the cancelled session's idle slot is the only one).
    rec.submit("e", "Name a colour.", SamplingParams(max_new_tokens=6))
    rec.step()
    assert engine.slots.slot_of("e") == slot and engine.slots.slot_of("c") is None
    rec.run_until_done()
    results = rec.results()
    ids_c, reason_c = results.pop("c")
    assert reason_c == "cancelled" and ids_c == solo["c"][0][:got]  # nothing more after the cancel
    results.pop("e")
    assert results == {k: v for k, v in solo.items() if k != "c"}


def test_requests_arriving_mid_batch_join_between_steps_and_finish_correctly(tiny, tokenizer, solo):
    engine = make_engine(tiny, tokenizer, 4)
    rec = Recorder(engine)
    first, late = FOUR[:2], FOUR[2:]
    for args in first:
        rec.submit(*args)
    while len(rec.token_steps["a"]) < 6:
        rec.step()
    for args in late:  # "b" is still decoding too: both newcomers join a running batch
        rec.submit(*args)
    rec.run_until_done()
    assert rec.results() == solo
    assert max(rec.batch_sizes) == 4


def test_a_long_prompt_is_chunked_between_the_decode_steps_of_the_others(tiny, tokenizer):
    engine = make_engine(tiny, tokenizer, 3)
    rec = Recorder(engine)
    rec.submit("x", "Hello.", SamplingParams(max_new_tokens=200))
    rec.submit("y", "Hi there.", SamplingParams(max_new_tokens=200))
    rec.step(3)
    assert engine.scheduler.decoding() == [1, 2]
    long_text = "A long message about the sea, its tides and its birds. " * 20
    n_prompt = len(tokenizer.apply_chat_template(request("z", long_text, SamplingParams()).messages))
    assert n_prompt > 4 * CHUNK
    rec.submit("z", long_text, SamplingParams(max_new_tokens=4))
    start = engine.steps
    before = {s: len(rec.token_steps[s]) for s in "xy"}
    while not rec.token_steps["z"]:
        rec.step()
    waited = engine.steps - start
    assert waited == math.ceil(n_prompt / CHUNK)  # one chunk per step, the first token with the last chunk
    for s in "xy":  # the running requests kept one token per step throughout
        assert len(rec.token_steps[s]) - before[s] == waited
    assert len(rec.token_steps["z"]) == 1  # its first token came with its last chunk, not before


def test_no_starvation_a_newcomer_among_eight_decoding_gets_its_first_token_within_bounded_steps(tiny, tokenizer):
    engine = make_engine(tiny, tokenizer, 9)
    rec = Recorder(engine)
    for i in range(8):
        rec.submit(f"r{i}", f"Count to {i + 10}, slowly.", SamplingParams(max_new_tokens=300))
    while len(engine.scheduler.decoding()) < 8:
        rec.step()
    newcomer = "Please describe the weather today in some detail. " * 6
    n_prompt = len(tokenizer.apply_chat_template(request("n", newcomer, SamplingParams()).messages))
    rec.submit("n", newcomer, SamplingParams(max_new_tokens=3))
    start = engine.steps
    while not rec.token_steps["n"]:
        rec.step()
        assert engine.steps - start <= 50
    assert engine.steps - start == math.ceil(n_prompt / CHUNK)
    assert rec.batch_sizes[-1] == 8  # the 8 decoded every step meanwhile
    rec.step(2)
    assert rec.batch_sizes[-1] == 9  # then the newcomer decodes with them


def test_with_every_slot_busy_the_queue_is_fifo_and_waits_only_for_the_first_slot_to_free(tiny, tokenizer):
    engine = make_engine(tiny, tokenizer, 8)
    rec = Recorder(engine)
    for i in range(8):  # r3 ends first (after 10 tokens); the rest run long
        rec.submit(f"r{i}", f"Count to {i + 10}.", SamplingParams(max_new_tokens=10 if i == 3 else 300))
    while len(engine.scheduler.decoding()) < 8:
        rec.step()
    rec.submit("q1", "First in line.", SamplingParams(max_new_tokens=3))
    rec.submit("q2", "Second in line.", SamplingParams(max_new_tokens=3))
    rec.step()
    assert engine.scheduler.queued() == [9, 10]  # no slot: both wait, in arrival order
    while not rec.token_steps["q1"]:
        rec.step()
    # q1 took r3's slot the step after r3 finished, and its prompt fits in one chunk.
    assert rec.token_steps["q1"][0] == rec.token_steps["r3"][-1] + 1
    assert engine.slots.slot_of("q1") is not None and engine.slots.slot_of("r3") is None
    assert engine.scheduler.queued() == [10] and not rec.token_steps["q2"]
    # q2 gets q1's slot (or nothing else): 3 tokens later, plus one step to admit and prefill.
    while not rec.token_steps["q2"]:
        rec.step()
    assert rec.token_steps["q2"][0] == rec.token_steps["q1"][-1] + 1


@pytest.mark.slow
def test_embedded_model_batched_equals_solo(smol_engine):
    prompts = ["Name a color.", "What is the capital of Italy?", "Say hello in French.", "Name a big animal."]
    samplings = [SamplingParams(max_new_tokens=12), SamplingParams(max_new_tokens=8),
                 SamplingParams(max_new_tokens=12, temperature=0.7, seed=3), SamplingParams(max_new_tokens=10)]  # fmt: skip
    solo: dict = {}
    for i, (p, sp) in enumerate(zip(prompts, samplings)):
        rec = Recorder(Engine(smol_engine.model, smol_engine.tokenizer, max_slots=1, max_seq_len=256))
        rec.submit(f"s{i}", p, sp)
        rec.run_until_done()
        solo.update(rec.results())
    rec = Recorder(Engine(smol_engine.model, smol_engine.tokenizer, max_slots=4, max_seq_len=256))
    for i, (p, sp) in enumerate(zip(prompts, samplings)):
        rec.submit(f"s{i}", p, sp)
    rec.run_until_done()
    assert max(rec.batch_sizes) == 4
    assert rec.results() == solo


def test_a_held_request_sits_steps_out_and_then_goes_on_unchanged(tiny, tokenizer, solo):
    rec = Recorder(make_engine(tiny, tokenizer, 2))
    a = rec.submit(*FOUR[0])
    rec.submit(*FOUR[2])
    rec.step(3)
    a.hold(True)
    before = len(rec.token_steps["a"])
    rec.step(4)
    assert len(rec.token_steps["a"]) == before  # no token while held; the other request went on
    assert rec.batch_sizes[-4:] == [1, 1, 1, 1]
    a.hold(False)
    rec.run_until_done()
    assert rec.results() == {"a": solo["a"], "c": solo["c"]}  # the pause changed nothing of either output
