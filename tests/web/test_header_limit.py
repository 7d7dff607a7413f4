"""The documented 64 KB request-head limit (docs/limits.md), enforced exactly over a real socket: a head over it is
answered 431 however it arrives (one write, many small writes, many headers), one at the limit is served."""
from __future__ import annotations

import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from web.transport import guarded_h11

sys.path.insert(0, str(Path(__file__).parents[1] / "server"))
from in_thread import serve_in_thread  # noqa: E402

LIMIT = 65536


async def _ok(scope: dict, receive: object, send: object) -> None:
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})  # type: ignore[operator]
    await send({"type": "http.response.body", "body": b"ok"})  # type: ignore[operator]


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    with serve_in_thread(_ok, "header-limit", http=guarded_h11(10.0, 64, LIMIT)) as p:
        yield p


def _status(port: int, head: bytes, piece_bytes: int | None = None) -> int:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        pieces = [head] if piece_bytes is None else [head[i : i + piece_bytes] for i in range(0, len(head), piece_bytes)]
        try:
            for piece in pieces:
                s.sendall(piece)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused before the rest was sent: the answer is still in our receive buffer
        answer = b""
        while b"\r\n" not in answer:
            chunk = s.recv(4096)
            if not chunk:
                break
            answer += chunk
    return int(answer.split(b" ", 2)[1])


def _head(headers: list[bytes]) -> bytes:
    return b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"".join(h + b"\r\n" for h in headers) + b"\r\n"


def _padded_to(total: int) -> bytes:
    """A head of exactly `total` bytes, one X-Pad header making up the size."""
    base = len(_head([b"X-Pad: "]))
    return _head([b"X-Pad: " + b"a" * (total - base)])


def test_a_100_kb_header_is_refused_with_431_in_one_write_and_in_pieces(port: int) -> None:
    head = _head([b"X-Pad: " + b"a" * 100_000])
    assert _status(port, head) == 431
    assert _status(port, head, piece_bytes=1400) == 431  # arriving as a slow client sends it: h11's own bound


def test_ten_thousand_small_headers_are_refused_with_431(port: int) -> None:
    head = _head([b"X-H%d: v" % i for i in range(10_000)])
    assert len(head) > 100_000
    assert _status(port, head) == 431


def test_a_head_at_the_limit_is_served_and_one_byte_more_is_not(port: int) -> None:
    assert len(_padded_to(LIMIT)) == LIMIT
    assert _status(port, _padded_to(LIMIT)) == 200
    assert _status(port, _padded_to(LIMIT + 1)) == 431
    assert _status(port, _head([b"X-Small: 1"])) == 200
