"""A conversation whose tokens outgrow the engine's context before its characters outgrow the history budget: the
engine leaves the oldest messages out (at a cut that would move every turn), the session then halves its history
at once and warms the shorter prompt, so the next turns reuse their cached prefix instead of prefilling it all
again. On the embedded SmolLM2 with a small context (the 150-turn soak's first-token problem, at small scale)."""
from __future__ import annotations

from collections.abc import Iterator

import pytest

from fakes import Harness
from llm_engine.engine import Engine
from parley.locate import find_embedded

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    engine = Engine.from_path(find_embedded("llm", "embedded-135m"), max_seq_len=384, max_slots=2)
    engine.start()
    yield engine
    engine.stop()


async def test_the_engine_leaving_messages_out_halves_the_history_and_later_turns_reuse_the_cache(engine: Engine) -> None:
    # a character budget far above what 384 tokens hold: only the engine's fitting can notice the overflow
    async with Harness(engine=engine, history_chars=100_000, warm_prompt=True, audio_lead_ms=60_000.0) as h:
        fitted_at = None
        for i in range(40):
            h.session.text_input(f"Turn {i}: 0x{i * 7919:x}, {i ** 3}, {i / 7:.5f}; say {i * 31} back to me.")
            trace = await h.wait_for("turn.trace", i + 1, timeout_s=120)
            if trace["llm"].get("dropped_messages"):
                fitted_at = i
                assert trace["context"]["dropped_messages"] > 0  # the session halved its own history at once
                break
        assert fitted_at is not None, "the prompt never outgrew the context"
        for j in range(fitted_at + 1, fitted_at + 3):
            h.session.text_input(f"Turn {j}: and {j}?")
            trace = await h.wait_for("turn.trace", j + 1, timeout_s=120)
            llm = trace["llm"]
            assert not llm.get("dropped_messages")  # the halved history fits with the reply's room
            assert llm["reused_tokens"] > 3 * llm["prefill_tokens"], llm  # the warmed prefix, not a full prefill
