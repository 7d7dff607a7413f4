"""bench.narrowband and bench.network in their tiny modes as subprocesses (the scripts keep working); the phone
line on tones (above 4 kHz gone, below kept to G.711's ~38 dB); the lossy link's relay and proxy on loopback."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench.narrowband import phone_line
from bench.parley_process import ParleyProcess

ROOT = Path(__file__).resolve().parents[2]


def tiny(name: str, out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -m bench.<name> --tiny` as a subprocess; it must succeed."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", f"bench.{name}", "--tiny", "--out", str(out), *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_the_phone_line_keeps_speech_band_and_drops_what_is_above() -> None:
    t = np.arange(16000) / 16000
    low, high = ((0.3 * np.sin(2 * np.pi * f * t)).astype(np.float32) for f in (440, 6000))
    line = phone_line(low + high)
    spectrum = np.abs(np.fft.rfft(line[2000:14000]))  # 1 Hz bins over 12000 samples at 16 kHz: bin = f * 0.75
    assert spectrum[int(6000 * 0.75)] < 0.01 * spectrum[int(440 * 0.75)]
    kept = phone_line(low)[2000:14000]
    snr_db = 10 * np.log10(np.sum(low[2000:14000] ** 2) / np.sum((kept - low[2000:14000]) ** 2))
    assert snr_db > 25, snr_db


@pytest.mark.slow
def test_narrowband_tiny(tmp_path: Path) -> None:
    out = tmp_path / "narrowband.json"
    proc = tiny("narrowband", out)
    bands = json.loads(out.read_text())["bands"]
    assert list(bands) == ["16 kHz", "μ-law 8 kHz"]
    for band in bands.values():
        assert band["words"] > 0 and 0 <= band["wer"] <= 1
        det = band["detectors"]["fixed"]
        assert (det["paused"], det["whole"]) == (2, 2) and det["split"] <= det["cut_early"] <= det["paused"]
    assert "μ-law 8 kHz" in proc.stdout and "WER" in proc.stdout


def test_a_seeded_link_loses_the_same_packets_and_keeps_order() -> None:
    from bench._lossy import Link

    a, b = Link(0.05, 40, 20, seed=3), Link(0.05, 40, 20, seed=3)
    drops = [a.drop() for _ in range(2000)]
    assert drops == [b.drop() for _ in range(2000)] and 60 <= sum(drops) <= 140  # ~5 %, the same each run
    dues = [a.due_s(i * 0.02) for i in range(500)]
    assert dues == sorted(dues) and min(d - i * 0.02 for i, d in enumerate(dues)) >= 0.02 - 1e-9


async def test_the_relay_and_the_proxy_carry_traffic_through_the_link() -> None:
    import asyncio

    from bench._lossy import Link, TcpProxy, UdpRelay

    got: list[bytes] = []

    class Sink(asyncio.DatagramProtocol):
        def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
            got.append(data)

    loop = asyncio.get_running_loop()
    server, _ = await loop.create_datagram_endpoint(Sink, local_addr=("127.0.0.1", 0))
    client, _ = await loop.create_datagram_endpoint(asyncio.DatagramProtocol, local_addr=("127.0.0.1", 0))
    relay = await UdpRelay("127.0.0.1", Link(0.5, 5, 2, seed=1), Link()).start()
    relay.server = server.get_extra_info("sockname")[:2]
    for i in range(200):
        client.sendto(b"%d" % i, ("127.0.0.1", relay.port("a")))
    while relay.up.packets < 200 or len(got) < relay.up.packets - relay.up.lost:
        await asyncio.sleep(0.01)
    assert len(got) == 200 - relay.up.lost and 60 < relay.up.lost < 140
    assert [int(x) for x in got] == sorted(int(x) for x in got)  # in order, the lost ones missing
    relay.close(), server.close(), client.close()

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(await reader.readexactly(30000))
        await writer.drain()
        writer.close()

    upstream = await asyncio.start_server(echo, "127.0.0.1", 0)
    proxy = await TcpProxy(upstream.sockets[0].getsockname()[:2], Link(0.3, 5, 2, seed=2), Link(0.3, 5, 2, seed=4)).start()
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    payload = bytes(range(250)) * 120
    writer.write(payload)
    await writer.drain()
    assert await reader.readexactly(len(payload)) == payload  # TCP: late, never lost or reordered
    writer.close()
    proxy.close(), upstream.close()


@pytest.mark.slow
def test_network_tiny(real_server: ParleyProcess, tmp_path: Path) -> None:
    """Against the bench tests' shared server (the shipped config, as the script would start)."""
    out = tmp_path / "network.json"
    proc = tiny("network", out, "--server", real_server.url)
    rows = json.loads(out.read_text())["rows"]
    # one conversation per transport through the seeded link at 5 % loss each way (lossless is the same link with
    # nothing dropped: the seeded-link test above); each answered, its numbers present
    assert [(r["transport"], r["loss_pct"]) for r in rows] == [("websocket", 5), ("webrtc", 5)]
    for r in rows:
        assert r["turns"] == 1 and r["v2v_p50"] is not None and r["v2v_p50"] > 0 and r["stall_max"] is not None
    # ~5 % of a few hundred segments (sent again after a timeout) and datagrams (gone) were lost
    assert all(not r["packets_lost"].startswith("0/") for r in rows), [r["packets_lost"] for r in rows]
    assert "Lossy link" in proc.stdout
