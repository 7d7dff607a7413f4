"""A real OTLP/HTTP trace receiver for the tests and `bench.e2e --otlp`: a loopback HTTP server that decodes each
ExportTraceServiceRequest with opentelemetry-proto and keeps the spans; in `hang` mode it reads requests and never
answers (a collector that is stuck)."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest, ExportTraceServiceResponse


@dataclass
class Received:
    """One span as the collector saw it: ids as hex, times in ns, attributes as Python values."""

    name: str
    trace_id: str
    span_id: str
    parent_id: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: list[tuple[str, int, dict[str, Any]]]
    status_code: int
    service: str

    @property
    def duration_ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


def _attrs(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


@dataclass
class OtlpReceiver:
    hang: bool = False
    spans: list[Received] = field(default_factory=list)
    requests: int = 0

    def __post_init__(self) -> None:
        self.changed = threading.Condition()
        self.release = threading.Event()  # set at the end: a hung handler may return
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with receiver.changed:
                    receiver.requests += 1
                    receiver.changed.notify_all()
                if receiver.hang:
                    receiver.release.wait()
                    return
                receiver._take(body)
                out = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, name="otlp-receiver", daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def _take(self, body: bytes) -> None:
        req = ExportTraceServiceRequest()
        req.ParseFromString(body)
        got = []
        for rs in req.resource_spans:
            service = str(_attrs(rs.resource.attributes).get("service.name", ""))
            for ss in rs.scope_spans:
                for s in ss.spans:
                    got.append(Received(
                        s.name, s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(), s.start_time_unix_nano,
                        s.end_time_unix_nano, _attrs(s.attributes),
                        [(e.name, e.time_unix_nano, _attrs(e.attributes)) for e in s.events], s.status.code, service,
                    ))  # fmt: skip
        with self.changed:
            self.spans += got
            self.changed.notify_all()

    def wait(self, cond: Any, timeout_s: float = 30.0) -> None:
        """Block until cond(self) holds (AssertionError after timeout_s)."""
        with self.changed:
            if not self.changed.wait_for(lambda: cond(self), timeout=timeout_s):
                raise AssertionError(f"OTLP receiver: condition not met in {timeout_s} s ({len(self.spans)} spans)")

    def named(self, name: str) -> list[Received]:
        return [s for s in self.spans if s.name == name]

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
