"""Mapping played audio back to the words heard (what barge-in keeps in history)."""
from __future__ import annotations

from voice.reply import PhraseSpan, spoken_text

SIX = "One two three four five six."  # 28 characters, 900 ms when finished


def test_a_phrase_cut_mid_way_keeps_the_share_of_its_words_played() -> None:
    spans = [PhraseSpan(SIX, 0.0, 900.0), PhraseSpan(SIX, 900.0, 1800.0)]
    assert spoken_text(spans, 900.0) == SIX
    assert spoken_text(spans, 1200.0) == SIX + " One two"
    assert spoken_text(spans, 5000.0) == SIX + " " + SIX


def test_all_audio_of_a_phrase_still_being_synthesised_is_not_all_its_words() -> None:
    # the second phrase has only 600 ms of its audio so far; at the first phrase's pace it lasts 900 ms
    spans = [PhraseSpan(SIX, 0.0, 900.0), PhraseSpan(SIX, 900.0, 1500.0, complete=False)]
    assert spoken_text(spans, 1500.0) == SIX + " One two three four"
    # with no finished phrase to take a pace from, the audio so far is all there is to go by
    assert spoken_text([PhraseSpan(SIX, 0.0, 300.0, complete=False)], 300.0) == SIX


async def test_the_text_writer_is_held_from_the_first_phrase_until_its_first_audio() -> None:
    import asyncio

    from fakes import FakeTts
    from voice.outbox import Outbox
    from voice.reply import Reply, VoiceBinding, WorkCounter

    events: list[str] = []
    outbox = Outbox()

    async def deltas():
        for word in "Sure. Here is a longer second sentence for you.".split():
            events.append(f"text:{word}")
            yield word + " "
            await asyncio.sleep(0)

    async def drain() -> None:
        while True:
            item = await outbox.get()
            if not hasattr(item, "body"):
                events.append("audio")
                item.on_sent()

    drainer = asyncio.create_task(drain())
    reply = Reply(1, outbox, VoiceBinding(FakeTts(ms_per_word=50.0)), 1.0, 16000, None, WorkCounter())
    await reply.run(deltas(), hold=lambda on: events.append(f"hold:{on}"))
    drainer.cancel()
    held, released = events.index("hold:True"), events.index("hold:False")
    assert events[held - 1] == "text:Sure." and held < released < events.index("audio")
    assert events[-1] == "hold:False"  # released again at the end, whatever happened
