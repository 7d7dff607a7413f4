"""A long conversation's oldest turns are summarised ahead of the history's bound, not dropped at it (voice.summary
on the fake engine): the summary is written in the conversation's side slot, waits while a reply runs, takes the old
turns' place as a reply ends, and the shorter prompt is warmed again at once; a later summary keeps the last one word
for word and adds the newer turns' (each pass of a small model over a summary loses some of it)."""
from __future__ import annotations

from fakes import FakeEngine, Harness
from voice.summary import SLACK

UNPACED = 60_000.0
FACT = "My name is Ana and I am vegetarian."


async def test_a_long_conversation_summarises_its_oldest_turns_instead_of_dropping_them() -> None:
    engine = FakeEngine(reply_words="Noted, thank you.".split())
    async with Harness(engine=engine, history_chars=1200, warm_prompt=True, audio_lead_ms=UNPACED) as h:
        for i in range(14):
            h.session.text_input(FACT if i == 0 else f"question number {i} " + "x" * 130)
            await h.wait_for("response.done", i + 1)
        traces = [await h.wait_for("turn.trace", n) for n in range(1, 15)]
        contexts = [t["context"] for t in traces if "context" in t]
        assert contexts and all("dropped_messages" not in c for c in contexts), contexts  # summarised in time
        assert all(c["summarised_messages"] >= 2 for c in contexts)
        # the next summary adds the newer part's to the last one, kept word for word (no second pass over it)
        assert [c["summary"] for c in contexts[:2]] == ["Noted, thank you.", "Noted, thank you. Noted, thank you."]
        asks = [(r, s) for r, s in zip(engine.requests, engine.streams) if r.session_id == "s1/summary" and r.sampling.max_new_tokens]
        assert len(asks) >= 2 and FACT in asks[0][0].messages[-1].content
        assert "Earlier:" not in asks[1][0].messages[-1].content and FACT not in asks[1][0].messages[-1].content
        # a reply began while one was being written: it was held (the fake engine runs it on regardless)
        assert any(stream.holds[:1] == [True] for _, stream in asks), [s.holds for _, s in asks]
        history = h.session.history
        assert history[0] == ("summary", contexts[-1]["summary"]) and history[1][0] == "user"
        assert sum(len(text) for _, text in history) <= 1200 * SLACK
        system = h.session.messages()[0][1]
        assert system.endswith(f"Earlier in this conversation (a summary): {contexts[-1]['summary']}")
        # the turn after each summary found the shorter prompt warm: it computed little of it
        after = [traces[k + 1]["llm"] for k, t in enumerate(traces[:-1]) if "context" in t]
        assert after and all(llm["reused_tokens"] > 3 * llm["prefill_tokens"] for llm in after), after
        # the prompt each summary makes was computed ahead in the side slot, for the next request to copy
        ahead = [r for r in engine.requests if r.session_id == "s1/summary" and r.sampling.max_new_tokens == 0]
        assert len(ahead) >= len(contexts) and all(r.background for r in ahead)
        assert ahead[0].messages[0].content.endswith(f"(a summary): {contexts[0]['summary']}")
    assert "s1/summary" not in engine.slots  # its side slot goes with the session


async def test_with_summaries_off_the_bound_drops_the_oldest_turns() -> None:
    async with Harness(history_chars=400, audio_lead_ms=UNPACED, summarise_history=False) as h:
        for i in range(12):
            h.session.text_input(f"question number {i} " + "x" * 40)
            await h.wait_for("response.done", i + 1)
        assert not [r for r in h.engine.requests if r.session_id.endswith("/summary")]
        assert h.session.history[0][0] == "user"


def test_a_summary_cut_at_its_token_limit_keeps_its_whole_sentences() -> None:
    from voice.summary import whole_sentences

    assert whole_sentences("Ana's dog is Biscuit. The number 16 is the six") == "Ana's dog is Biscuit."
    assert whole_sentences("No end at all") == "No end at all" and whole_sentences("Version 2.5 is out! And") == "Version 2.5 is out!"


def test_a_summary_due_as_the_session_closes_starts_nothing_and_raises_nothing() -> None:
    """A reply cancelled by the session's close ends (go_on) while its task group shuts down: no summary starts."""
    from voice.history import History
    from voice.summary import Summariser

    class Llm:
        def other_requests(self, session_id: str) -> int:
            return 0

    def closing(*args: object) -> None:
        raise RuntimeError("TaskGroup is shutting down")

    memory = History(max_chars=100, max_messages=100)
    for i in range(6):
        memory.add_user(f"question {i} " + "x" * 10)
        memory.add("assistant", "an answer")
    assert memory.summary_due(0.75)
    summariser = Summariser("s1", memory, Llm(), closing, lambda: "system")  # type: ignore[arg-type]
    summariser.go_on()
    assert summariser._task is None
