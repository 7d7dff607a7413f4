"""The session outbox: control messages never wait behind audio, a clear drops a turn's audio, and what it keeps
per turn stays bounded however long the conversation."""
from __future__ import annotations

from voice.outbox import OutAudio, OutJson, Outbox


async def drain(box: Outbox) -> list[OutJson | OutAudio]:
    items = []
    while box.pending():
        items.append(await box.get())
    return items


async def test_sequence_numbers_count_per_turn_and_a_clear_drops_the_turns_audio_first_in_line() -> None:
    box = Outbox()
    for turn in (1, 1, 2):
        await box.send_audio(turn, b"\x00\x00")
    box.send("response.text.delta", turn_id=2, text="hi")
    box.clear(2, t_ms=10.0)
    await box.send_audio(2, b"\x00\x00")  # a late chunk of the cleared turn
    items = await drain(box)
    assert isinstance(items[0], OutJson) and items[0].body == {"type": "response.audio.clear", "turn_id": 2, "t_ms": 10.0}
    assert [(i.turn_id, i.seq) for i in items if isinstance(i, OutAudio)] == [(1, 0), (1, 1)]
    await box.send_audio(3, b"\x00\x00")
    assert [(i.turn_id, i.seq) for i in await drain(box) if isinstance(i, OutAudio)] == [(3, 0)]


async def test_a_long_conversation_keeps_only_a_few_cleared_turns() -> None:
    box = Outbox()
    for turn in range(1, 1001):
        await box.send_audio(turn, b"\x00\x00")
        box.clear(turn)
    await drain(box)
    await box.send_audio(1000, b"\x00\x00")  # the turn cleared last still drops its late audio
    assert box.pending() == 0
    assert len(box._cleared) <= 8  # bounded: replies run one after another, old turns send nothing more


async def test_control_messages_for_a_client_that_does_not_read_are_bounded() -> None:
    box = Outbox(max_json_items=3)
    for i in range(10):
        box.send("error", code="unknown_type", message=str(i), fatal=False)
    assert box.pending() == 3 and box.overflowed
    assert [item.body["message"] for item in await drain(box)] == ["0", "1", "2"]  # the first ones, in order
    box.send("error", code="x", message="after", fatal=False)  # room again once the client reads
    assert box.pending() == 1
