"""Wire protocol v1 as pure functions: parsing client messages, encoding server ones, the audio header."""
from __future__ import annotations

import json

import pytest

from web import protocol as P


def code_of(raw: str) -> tuple[str, bool]:
    with pytest.raises(P.ProtocolError) as err:
        P.parse_text(raw)
    return err.value.code, err.value.fatal


def test_each_client_message_parses_to_its_model() -> None:
    start = P.parse_text('{"type":"session.start","protocol":1,"sample_rate":16000,"persona":"concise"}')
    assert isinstance(start, P.SessionStart) and start.persona == "concise" and start.voice is None
    assert P.parse_text('{"type":"input.text","text":"hi"}') == P.InputText(type="input.text", text="hi")
    assert isinstance(P.parse_text('{"type":"response.cancel"}'), P.ResponseCancel)
    mark = P.parse_text('{"type":"playback.mark","turn_id":3,"played_ms":250}')
    assert isinstance(mark, P.PlaybackMark) and (mark.turn_id, mark.played_ms) == (3, 250.0)
    assert P.parse_text('{"type":"session.update","voice":"kal"}') == P.SessionUpdate(type="session.update", voice="kal")


@pytest.mark.parametrize(
    ("raw", "code", "fatal"),
    [
        ("{oops", "bad_json", False),
        ("[1, 2]", "bad_json", False),
        ('{"type":"response.create"}', "unknown_type", False),
        ('{"text":"no type"}', "unknown_type", False),
        ('{"type":"input.text","text":""}', "invalid_message", False),
        ('{"type":"input.text","text":"hi","extra":1}', "invalid_message", False),
        ('{"type":"playback.mark","turn_id":-1,"played_ms":0}', "invalid_message", False),
        ('{"type":"session.start","protocol":2}', "bad_protocol_version", True),
        ('{"type":"session.start","protocol":1,"sample_rate":12345}', "bad_sample_rate", False),
    ],
)
def test_bad_client_messages_get_their_error_code(raw: str, code: str, fatal: bool) -> None:
    assert code_of(raw) == (code, fatal)


def test_wrong_version_closes_with_protocol_error() -> None:
    with pytest.raises(P.ProtocolError) as err:
        P.parse_text('{"type":"session.start","protocol":0}')
    assert err.value.close_code == P.CLOSE_PROTOCOL_ERROR == 1002


def test_audio_checks_odd_length_and_one_second_limit() -> None:
    P.check_audio(b"\x00" * 32000, 16000)  # exactly 1 s
    for data, code in ((b"\x00" * 641, "bad_audio"), (b"\x00" * 32002, "audio_too_long")):
        with pytest.raises(P.ProtocolError) as err:
            P.check_audio(data, 16000)
        assert err.value.code == code and not err.value.fatal
    P.check_audio(b"\x00" * 96000, 48000)  # 1 s at 48 kHz


def test_audio_header_round_trip_and_layout() -> None:
    msg = P.pack_audio(7, 65536, b"\x01\x02")
    assert msg[:8] == (7).to_bytes(4, "little") + (65536).to_bytes(4, "little")
    assert P.unpack_audio(msg) == (7, 65536, b"\x01\x02")
    with pytest.raises(ValueError):
        P.unpack_audio(b"\x00" * 7)


def test_encode_checks_required_fields() -> None:
    body = json.loads(P.encode("response.done", turn_id=1, text="a", interrupted=False, spoken_text="a"))
    assert body == {"type": "response.done", "turn_id": 1, "text": "a", "interrupted": False, "spoken_text": "a"}
    with pytest.raises(KeyError):
        P.encode("response.done", turn_id=1)
    assert json.loads(P.error_message("bad_json", "x", fatal=False)) == {"type": "error", "code": "bad_json", "message": "x", "fatal": False}


def test_an_unknown_field_name_is_quoted_short() -> None:
    """A field name is the client's text: a 900 KB one must not come back whole in the error."""
    with pytest.raises(P.ProtocolError) as err:
        P.parse_text(json.dumps({"type": "input.text", "text": "hi", "k" * 900_000: 1}))
    assert err.value.code == "invalid_message" and len(str(err.value)) < 300
