"""A new session is cheap: a persona's greeting is synthesised once per (text, voice, rate) and its audio reused by
every later session; a changed persona or voice is synthesised afresh (the TTS's own calls are counted)."""
from __future__ import annotations

import numpy as np
import pytest

from fakes import PERSONAS, Harness
from voice.phrase_audio import PhraseAudioCache
from voice.session import Session

pytestmark = pytest.mark.timeout(60)


def _beside(first: Harness) -> Harness:
    """Another connection's session on the same server: the same loaded stages (and so the same audio cache)."""
    h = Harness(greet=True)
    h.stages, h.tts = first.stages, first.tts
    h.session = Session("s2", first.stages, h.settings, PERSONAS, "assistant", on_trace=h.traces.append)
    return h


def _greeting_ms(h: Harness) -> float:
    return sum(m["ms"] for m in h.of("audio"))


def _syntheses(h: Harness, words: str) -> int:
    return sum(1 for text, _, _ in h.tts.calls + h.kal.calls if text in words)


async def test_the_greeting_is_synthesised_once_and_replayed_for_the_next_session() -> None:
    async with Harness(greet=True) as first:
        await first.wait_for("response.done")
        made = len(first.tts.calls)
        assert made >= 1 and _syntheses(first, "Hello there.") == made
        async with _beside(first) as second:
            done = await second.wait_for("response.done")
            assert done["text"] == "Hello there." and not done["interrupted"]
            assert len(first.tts.calls) == made  # no synthesis for the second session's greeting
            assert _greeting_ms(second) == pytest.approx(_greeting_ms(first)) and _greeting_ms(second) > 0
            assert first.stages.phrase_audio.hits == made


async def test_a_persona_or_voice_change_synthesises_the_new_greeting() -> None:
    async with Harness(greet=True) as h:
        await h.wait_for("response.done")
        assert len(h.kal.calls) == 0
        h.session.update(persona="storyteller")  # another greeting, in another voice
        await h.wait_for("response.done", 2)
        assert len(h.kal.calls) >= 1 and all("traveller" in t or "Hello" in t for t, _, _ in h.kal.calls)
        kal_made = len(h.kal.calls)
        h.session.update(persona="assistant", voice="kal")  # the first greeting, in another voice: not the cached one
        await h.wait_for("response.done", 3)
        assert len(h.kal.calls) > kal_made
        joe_made = len(h.tts.calls)
        h.session.update(persona="storyteller")
        await h.wait_for("response.done", 4)
        h.session.update(persona="assistant")  # the first greeting in its own voice again: replayed
        await h.wait_for("response.done", 5)
        assert h.of("response.done")[-1]["text"] == "Hello there."
        assert len(h.tts.calls) == joe_made


def test_the_cache_is_bounded_and_keeps_only_whole_phrases_read_only() -> None:
    cache = PhraseAudioCache(max_entries=2, max_seconds=10.0)
    tts = object()
    keys = [cache.key(f"phrase {i}", tts, None, 1.0, 16000) for i in range(3)]
    for k in keys:
        cache.put(k, [np.zeros(16000, np.float32)])
    assert len(cache) == 2 and cache.get(keys[0]) is None and cache.get(keys[2]) is not None
    chunk = cache.get(keys[2])[0]  # type: ignore[index]
    with pytest.raises(ValueError):
        chunk[0] = 1.0  # shared between sessions: nobody may write into it
    cache.put(cache.key("long", tts, None, 1.0, 16000), [np.zeros(16000 * 11, np.float32)])
    assert cache.get(cache.key("long", tts, None, 1.0, 16000)) is None  # over the whole budget: never kept
    assert cache.key("a", tts, None, 1.0, 16000) != cache.key("a", tts, "kal", 1.0, 16000) != cache.key("a", tts, None, 1.25, 16000)
