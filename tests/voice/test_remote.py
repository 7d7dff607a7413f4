"""Remote stages when their server is not there or not configured: one clear error naming it, never a hang.
(Working remote stages are tested against a real `parley stages` in tests/server/test_remote_stages.py.)"""
from __future__ import annotations

import socket
import threading

import numpy as np
import pytest

from voice.asr import StreamingTranscriber
from voice.llm_bridge import LlmError
from voice.remote.asr import RemoteTranscriber
from voice.remote.client import RemoteSpec, RemoteStageError
from voice.remote.llm import RemoteLlm
from voice.remote.tts import RemoteTts


@pytest.fixture
def nobody() -> RemoteSpec:
    """A loopback port nothing listens on: connections are refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return RemoteSpec(f"http://127.0.0.1:{port}/v1", timeout_s=5)


def test_a_key_variable_that_is_not_set_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PARLEY_NO_SUCH_KEY", raising=False)
    with pytest.raises(RemoteStageError, match="PARLEY_NO_SUCH_KEY.*http://llm:8000/v1"):
        RemoteLlm(RemoteSpec("http://llm:8000/v1", api_key_env="PARLEY_NO_SUCH_KEY"))
    monkeypatch.setenv("PARLEY_NO_SUCH_KEY", "k")
    assert RemoteSpec("http://llm:8000/v1", api_key_env="PARLEY_NO_SUCH_KEY").api_key() == "k"


async def test_an_llm_server_that_is_down_is_one_error_event(nobody: RemoteSpec) -> None:
    llm = RemoteLlm(nobody)
    events = [e async for e in llm.generate("s", [("user", "Hi")], max_new_tokens=4)]
    assert len(events) == 1 and isinstance(events[0], LlmError) and nobody.base_url in events[0].message
    assert isinstance(await llm.prefill("s", [("user", "Hi")]), LlmError)
    assert llm.active_slots() == 0 and llm.probes_user_end is False


def test_asr_and_tts_servers_that_are_down_raise_naming_them(nobody: RemoteSpec) -> None:
    with pytest.raises(RemoteStageError, match=f"ASR server {nobody.base_url}"):
        RemoteTranscriber(nobody).transcribe(np.zeros(16000, dtype=np.float32))
    assert RemoteTranscriber(nobody).transcribe(np.zeros(800, dtype=np.float32)).text == ""  # too short to send
    with pytest.raises(RemoteStageError, match=f"TTS server {nobody.base_url}"):
        list(RemoteTts(nobody).synthesize("Hello."))


def test_a_remote_recogniser_is_asked_for_finals_only(nobody: RemoteSpec) -> None:
    stt = StreamingTranscriber(RemoteTranscriber(nobody), partial_interval_ms=100)
    stt.append(np.zeros(32000, dtype=np.float32))
    assert not stt.partial_due()


class Silent:
    """A loopback server that accepts connections and never answers: counts how many were opened."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.accepted: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed
                return
            self.accepted.append(conn)

    @property
    def spec(self) -> RemoteSpec:
        return RemoteSpec(f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1", timeout_s=0.5)

    def close(self) -> None:
        self.sock.close()
        for conn in self.accepted:
            conn.close()


def test_a_server_that_never_answers_times_out_after_one_retry() -> None:
    """timeout_s bounds each try; a stage tries twice (one retry), then one error names the server."""
    silent = Silent()
    try:
        with pytest.raises(RemoteStageError, match=f"ASR server {silent.spec.base_url}"):
            RemoteTranscriber(silent.spec).transcribe(np.zeros(16000, dtype=np.float32))
        assert len(silent.accepted) == 2  # the first try and its one retry
    finally:
        silent.close()
