"""Phone calls: a scripted Twilio Media Streams client calls the real server (embedded models) on /twilio/stream,
hears the greeting and the answer to a spoken μ-law question as μ-law media (transcribed back), echoes the
server's marks as playback goes, and gets a `clear` when it talks over an answer; a stream without the token is
closed. /twilio/voice answers TwiML only to a request Twilio signed (the `twilio` package computes signatures)."""
from __future__ import annotations

import time

import numpy as np
import pytest
import yaml
from starlette.testclient import TestClient
from twilio.request_validator import RequestValidator

from bench import corpus
from parley.config import load_config
from server_config import TOKEN, write_test_config
from support.waiting import wait_for
from twilio_client import TwilioClient
from voice import codec
from voice.audio import resample
from web.app import create_app

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

STORY = "Tell me a long story about a brave knight who fights a dragon in the mountains."
INTERRUPTION = "Wait, stop please, I have another question."
FRANCE = "What is the capital of France?"


def ulaw_speech(text: str) -> bytes:
    audio, rate = corpus.speak_piper(text, deterministic=True)
    return codec.encode("pcmu", resample(corpus.to_16k(audio, rate), 16000, codec.G711_RATE))


def quiet(ms: int) -> bytes:
    return b"\xff" * (codec.G711_RATE * ms // 1000)  # μ-law silence


def heard(tw: TwilioClient, live_server, start: int, stop: int | None = None) -> str:
    return live_server.runtime.stages.transcriber.transcribe(resample(tw.audio(start, stop), codec.G711_RATE, 16000)).text


async def test_a_phone_call_greeting_question_marks_and_barge_in(live_server) -> None:
    state = live_server.state
    url = f"ws://127.0.0.1:{live_server.port}/twilio/stream"
    async with TwilioClient(url, params={"token": TOKEN}) as tw:
        await wait_for(lambda: len(state.sessions) == 1, what="the call's session")
        session = next(iter(state.sessions.values()))

        def idle() -> bool:  # the reply before has been sent whole and ended
            return session.turns.replying_to is None and (session.replies.task is None or session.replies.task.done())

        # the greeting, spoken while the caller is quiet, arrives as μ-law media
        await tw.stream(quiet(20000), until=lambda: bool(tw.of("media")) and idle())
        greeting = session.persona.greeting
        assert corpus.wer(greeting, heard(tw, live_server, 0)) <= 0.3, heard(tw, live_server, 0)
        # a mark follows each piece of audio; echoed as Twilio plays them, they are the session's playback marks
        marks = [m["mark"]["name"] for m in tw.of("mark")]
        assert len(marks) == len(tw.of("media")) and all(m.startswith("parley:") for m in marks)
        turn, whole_ms = int(marks[-1].split(":")[1]), float(marks[-1].split(":")[2])
        assert whole_ms == pytest.approx(1000 * len(tw.audio()) / codec.G711_RATE, abs=1)
        greeted = session.replies.current
        assert greeted is not None and greeted.turn_id == turn
        await wait_for(lambda: greeted.played_ms == whole_ms, timeout_s=30, what="the greeting's last mark echoed")
        assert tw.echoed == marks
        assert all(m["streamSid"] == tw.stream_sid for m in tw.received)

        # a spoken question, answered in μ-law that says what the server says it answered
        asked = len(tw.received)
        question = corpus.REQUESTS[0]
        await tw.stream(ulaw_speech(question) + quiet(30000),
                        until=lambda: len(session.history) >= 2 and idle() and len(tw.received) > asked)  # fmt: skip
        user = [text for role, text in session.history if role == "user"]
        assert corpus.wer(question, user[-1]) <= 0.2, user
        answer = [text for role, text in session.history if role == "assistant"][-1]
        assert corpus.wer(answer, heard(tw, live_server, asked)) <= 0.3, (answer, heard(tw, live_server, asked))

        # talking over a long answer: Twilio is told to clear what it holds
        told = len(tw.received)
        await tw.stream(ulaw_speech(STORY) + quiet(30000), until=lambda: any(m["event"] == "media" for m in tw.received[told:]))
        await tw.stream(ulaw_speech(INTERRUPTION) + quiet(5000), until=lambda: bool(tw.of("clear")))
        clear = tw.of("clear")
        assert clear and clear[0]["streamSid"] == tw.stream_sid

        # after the barge-in, the next answer reaches the caller's ear sample for sample as the server synthesised it
        # (the answer before showed that speech recognised back; this one's words are whatever the small test model
        # rambles, which Whisper at 8 kHz collapses and mishears too much to compare word for word)
        await tw.stream(quiet(30000), until=lambda: idle() and tw.played_until_s < time.monotonic())
        synthesised: dict[int, list[bytes]] = {}
        send_audio = session.outbox.send_audio

        async def recording(turn_id: int, pcm16: bytes, on_sent=None) -> None:  # noqa: ANN001
            synthesised.setdefault(turn_id, []).append(pcm16)
            await send_audio(turn_id, pcm16, on_sent)

        session.outbox.send_audio = recording  # type: ignore[method-assign]
        since, replies = time.monotonic(), len(session.history)
        await tw.stream(ulaw_speech(FRANCE) + quiet(30000),
                        until=lambda: len(session.history) >= replies + 2 and idle() and tw.played_until_s < time.monotonic())  # fmt: skip
        sent = [m for m in tw.received if m["at_s"] >= since]
        # a clear here stops an early reply that the rest of the question rejoined (or nothing, in the last reply's
        # echo tail): what follows the last one is the answer
        cut = max((i for i, m in enumerate(sent) if m["event"] == "clear"), default=-1)
        turns = {int(m["mark"]["name"].split(":")[1]) for m in sent[cut + 1 :] if m["event"] == "mark"}
        assert len(turns) == 1  # one reply's audio, not two mixed
        ear = tw.heard(sent[cut]["at_s"] if cut >= 0 else since)
        assert np.array_equal(ear, codec.decode("pcmu", codec.ulaw_encode(b"".join(synthesised[turns.pop()]))))  # all of it
        assert len(ear) > codec.G711_RATE // 2
    await wait_for(lambda: state.connections == 0, what="the call to end")
    assert not state.sessions


async def test_a_stream_without_the_token_is_closed(live_server) -> None:
    url = f"ws://127.0.0.1:{live_server.port}/twilio/stream"
    async with TwilioClient(url, params={"token": "wrong"}) as tw:
        await tw.ws.wait_closed()
        assert not tw.of("media") and not live_server.state.sessions


def test_the_webhook_answers_twiml_only_to_a_signed_request(tmp_path, monkeypatch) -> None:
    path = write_test_config(tmp_path, more={"twilio": {"auth_token_env": "PARLEY_TEST_TWILIO_TOKEN",
                                                        "public_url": "https://parley.example.com"}})  # fmt: skip
    cfg = load_config(path)
    monkeypatch.setenv("PARLEY_TEST_TWILIO_TOKEN", "twilio-secret")
    client = TestClient(create_app(cfg, load=lambda c: None), base_url="http://127.0.0.1")  # no lifespan: no models
    form = {"CallSid": "CA123", "From": "+15550001111", "To": "+15550002222", "AccountSid": "AC9"}
    url = f"https://parley.example.com/twilio/voice?token={TOKEN}"
    signed = RequestValidator("twilio-secret").compute_signature(url, form)
    local = f"/twilio/voice?token={TOKEN}"
    ok = client.post(local, data=form, headers={"X-Twilio-Signature": signed})
    assert ok.status_code == 200 and ok.headers["content-type"].startswith("application/xml")
    assert '<Stream url="wss://parley.example.com/twilio/stream">' in ok.text and f'value="{TOKEN}"' in ok.text
    wrong = RequestValidator("another-secret").compute_signature(url, form)
    assert client.post(local, data=form, headers={"X-Twilio-Signature": wrong}).status_code == 403
    assert client.post(local, data=form).status_code == 403  # unsigned
    tampered = {**form, "From": "+15559999999"}
    assert client.post(local, data=tampered, headers={"X-Twilio-Signature": signed}).status_code == 403
    monkeypatch.delenv("PARLEY_TEST_TWILIO_TOKEN")
    assert client.post(local, data=form, headers={"X-Twilio-Signature": signed}).status_code == 500  # said so


def test_the_twilio_config_keys(tmp_path) -> None:
    cfg = load_config(write_test_config(tmp_path))
    assert cfg.twilio.auth_token_env is None and cfg.twilio.public_url is None  # shipped: no signature checks
    data = yaml.safe_load(open(write_test_config(tmp_path / "b", more={"twilio": {"persona": "nobody"}})))
    assert data["twilio"]["persona"] == "nobody"
    with pytest.raises(Exception, match="twilio.persona"):
        load_config(tmp_path / "b" / "configs" / "default.yaml")


def test_a_stream_twilio_did_not_sign_is_refused(tmp_path, monkeypatch) -> None:
    from starlette.websockets import WebSocketDisconnect

    cfg = load_config(write_test_config(tmp_path, more={"twilio": {"auth_token_env": "PARLEY_TEST_TWILIO_TOKEN"}}))
    monkeypatch.setenv("PARLEY_TEST_TWILIO_TOKEN", "twilio-secret")
    client = TestClient(create_app(cfg, load=lambda c: None), base_url="http://127.0.0.1")
    signed = RequestValidator("twilio-secret").compute_signature("wss://127.0.0.1/twilio/stream", {})
    with client.websocket_connect("ws://127.0.0.1/twilio/stream", headers={"X-Twilio-Signature": signed}) as ws:
        ws.send_json({"event": "connected", "protocol": "Call", "version": "1.0.0"})  # accepted: the call may start
    wrong = RequestValidator("another-secret").compute_signature("wss://127.0.0.1/twilio/stream", {})
    with pytest.raises(WebSocketDisconnect) as refused:
        with client.websocket_connect("ws://127.0.0.1/twilio/stream", headers={"X-Twilio-Signature": wrong}) as ws:
            ws.receive_text()
    assert refused.value.code == 1008
