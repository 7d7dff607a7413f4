"""A bad network made in userspace (no `tc netem` on these machines): seeded loss, delay and jitter, as a UDP relay
(WebRTC's media and data: a packet lost is gone) and a TCP proxy (the WebSocket: a segment lost is sent again
after a retransmission timeout, and everything behind it waits for it: head-of-line blocking). Loopback only.
"""
from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from dataclasses import dataclass, field

RTO_MS = 200.0  # Linux's minimum retransmission timeout: what one lost segment costs a TCP stream


@dataclass
class Link:
    """One direction of a link: each packet is lost with `loss`, else delayed `delay_ms` ± `jitter_ms` (uniform),
    in order."""

    loss: float = 0.0
    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    seed: int = 0
    packets: int = 0
    lost: int = 0
    rng: random.Random = field(init=False, repr=False)
    _last_due_s: float = field(default=0.0, init=False, repr=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def drop(self) -> bool:
        self.packets += 1
        if self.rng.random() < self.loss:
            self.lost += 1
            return True
        return False

    def delay_s(self) -> float:
        return max(0.0, self.delay_ms + self.rng.uniform(-self.jitter_ms, self.jitter_ms)) / 1000.0

    def due_s(self, now_s: float, extra_s: float = 0.0) -> float:
        """When a packet sent now arrives: delayed and jittered, but not before the one sent before it (one path
        is a queue: jitter varies the wait, it does not reorder)."""
        self._last_due_s = max(self._last_due_s, now_s + self.delay_s() + extra_s)
        return self._last_due_s


class _Side(asyncio.DatagramProtocol):
    def __init__(self, relay: "UdpRelay", name: str) -> None:
        self.relay, self.name = relay, name
        self.transport: asyncio.DatagramTransport | None = None
        self.pending: deque[tuple[bytes, tuple[str, int]]] = deque()  # packets this side is to send, oldest first

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.relay.forward(self.name, data, addr)


class UdpRelay:
    """Two sockets: `a` faces the client, `b` the server. What reaches `a` leaves `b` for the server's address and
    what reaches `b` leaves `a` for the client's, each through its direction's Link (reordering included)."""

    def __init__(self, host: str, up: Link, down: Link) -> None:
        self.host, self.up, self.down = host, up, down
        self.client: tuple[str, int] | None = None
        self.server: tuple[str, int] | None = None

    async def start(self) -> "UdpRelay":
        loop = asyncio.get_running_loop()
        _, self.a = await loop.create_datagram_endpoint(lambda: _Side(self, "a"), local_addr=(self.host, 0))
        _, self.b = await loop.create_datagram_endpoint(lambda: _Side(self, "b"), local_addr=(self.host, 0))
        return self

    def port(self, side: str) -> int:
        proto = self.a if side == "a" else self.b
        assert proto.transport is not None
        return int(proto.transport.get_extra_info("sockname")[1])

    def forward(self, side: str, data: bytes, addr: tuple[str, int]) -> None:
        if side == "a":
            self.client = self.client or addr
            link, out, to = self.up, self.b, self.server
        else:
            link, out, to = self.down, self.a, self.client
        if to is None or link.drop() or out.transport is None:
            return
        loop = asyncio.get_running_loop()
        out.pending.append((data, to))
        loop.call_at(link.due_s(loop.time()), self._send, out)

    @staticmethod
    def _send(out: _Side) -> None:
        """Each call sends the oldest packet waiting (timers due at the same moment fire in any order)."""
        data, to = out.pending.popleft()
        if out.transport is not None and not out.transport.is_closing():
            out.transport.sendto(data, to)

    def close(self) -> None:
        for proto in (self.a, self.b):
            if proto.transport is not None:
                proto.transport.close()


class TcpProxy:
    """A TCP proxy to `target`: each chunk read is delayed by its direction's Link; a chunk the link 'loses' is
    delivered one RTO late instead (TCP resends it), and nothing behind it is delivered before it."""

    def __init__(self, target: tuple[str, int], up: Link, down: Link) -> None:
        self.target, self.up, self.down = target, up, down
        self.server: asyncio.Server | None = None

    async def start(self) -> "TcpProxy":
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(self._pump(reader, up_w, self.up), self._pump(up_r, writer, self.down), return_exceptions=True)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, link: Link) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, data = await queue.get()
                if not data:
                    break
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                writer.write(data)
                await writer.drain()
            writer.close()

        sender = asyncio.create_task(deliver())
        try:
            while data := await reader.read(65536):
                penalty = RTO_MS / 1000.0 if link.drop() else 0.0
                queue.put_nowait((link.due_s(time.monotonic(), penalty), data))  # in order: TCP never reorders
        finally:
            queue.put_nowait((0.0, b""))
            await asyncio.gather(sender, return_exceptions=True)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
