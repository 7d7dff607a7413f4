"""Real OTLP trace receivers for the tests and `bench.e2e --otlp`: a loopback HTTP server (OtlpReceiver) or gRPC
server (OtlpGrpcReceiver) that decodes each ExportTraceServiceRequest with opentelemetry-proto and keeps the spans;
the HTTP one in `hang` mode reads requests and never answers (a collector that is stuck)."""
from __future__ import annotations

import threading
from dataclasses import dataclass
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


class _Collected:
    """The spans a receiver took in, and waiting on them."""

    def __init__(self) -> None:
        self.spans: list[Received] = []
        self.requests = 0
        self.changed = threading.Condition()

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


class OtlpReceiver(_Collected):
    """OTLP/HTTP on a free loopback port."""

    def __init__(self, hang: bool = False) -> None:
        super().__init__()
        self.hang = hang
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

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


class OtlpGrpcReceiver(_Collected):
    """OTLP over gRPC on a free loopback port (grpcio and opentelemetry-proto's service)."""

    def __init__(self) -> None:
        super().__init__()
        import grpc
        from concurrent import futures

        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

        receiver = self

        class Service(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request: ExportTraceServiceRequest, context: Any) -> ExportTraceServiceResponse:  # noqa: N802
                with receiver.changed:
                    receiver.requests += 1
                receiver._take(request.SerializeToString())
                return ExportTraceServiceResponse()

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.server.stop(grace=None)
