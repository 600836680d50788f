"""A small OTLP/HTTP receiver for tests: POST /v1/traces and /v1/metrics (protobuf, optionally
gzip- or deflate-compressed), answered 200 with an empty response message.

    with OtlpReceiver() as rx:
        ...  # export to rx.endpoint (http://127.0.0.1:PORT)
        rx.wait_for(lambda: "process q" in rx.span_names(), within=10)
"""

from __future__ import annotations

import gzip
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.metrics.v1.metrics_pb2 import Metric
from opentelemetry.proto.trace.v1.trace_pb2 import Span


class OtlpReceiver:
    """Collects OTLP/HTTP trace and metric export requests on a free loopback port."""

    def __init__(self) -> None:
        self.traces: list[ExportTraceServiceRequest] = []
        self.metrics: list[ExportMetricsServiceRequest] = []
        self.errors: list[str] = []
        self.requests: list[tuple[str, str]] = []  # (path, content-encoding)
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                encoding = (self.headers.get("Content-Encoding") or "").lower()
                try:
                    if encoding == "gzip":
                        body = gzip.decompress(body)
                    elif encoding == "deflate":
                        body = zlib.decompress(body)
                    elif encoding not in ("", "identity"):
                        raise ValueError(f"unsupported Content-Encoding {encoding!r}")
                    if self.path == "/v1/traces":
                        request: Any = ExportTraceServiceRequest.FromString(body)
                        response: Any = ExportTraceServiceResponse()
                        target: list[Any] = receiver.traces
                    elif self.path == "/v1/metrics":
                        request = ExportMetricsServiceRequest.FromString(body)
                        response = ExportMetricsServiceResponse()
                        target = receiver.metrics
                    else:
                        self._answer(404, b"")
                        return
                except Exception as exc:  # a bad body: tell the test, answer 400
                    with receiver._lock:
                        receiver.errors.append(f"{self.path}: {exc!r}")
                    self._answer(400, b"")
                    return
                with receiver._lock:
                    target.append(request)
                    receiver.requests.append((self.path, encoding))
                self._answer(200, response.SerializeToString())

            def _answer(self, status: int, payload: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> OtlpReceiver:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- reading what arrived --------------------------------------------------------------

    def spans(self) -> list[tuple[dict[str, Any], Span]]:
        """(resource attributes, span) of every span received."""
        with self._lock:
            requests = list(self.traces)
        out: list[tuple[dict[str, Any], Span]] = []
        for request in requests:
            for rs in request.resource_spans:
                resource = attributes(rs.resource.attributes)
                for ss in rs.scope_spans:
                    out.extend((resource, span) for span in ss.spans)
        return out

    def span_names(self) -> list[str]:
        return [span.name for _, span in self.spans()]

    def metrics_named(self, name: str) -> list[tuple[dict[str, Any], Metric]]:
        """(resource attributes, metric) of every exported metric called ``name``."""
        with self._lock:
            requests = list(self.metrics)
        out: list[tuple[dict[str, Any], Metric]] = []
        for request in requests:
            for rm in request.resource_metrics:
                resource = attributes(rm.resource.attributes)
                for sm in rm.scope_metrics:
                    out.extend((resource, m) for m in sm.metrics if m.name == name)
        return out

    def wait_for(self, predicate: Callable[[], bool], within: float, what: str) -> None:
        deadline = time.monotonic() + within
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"OTLP receiver: timed out after {within}s waiting for {what}")
            time.sleep(0.02)


def attributes(kvs: Any) -> dict[str, Any]:
    """OTLP ``KeyValue`` attributes as a plain dict (string, int, double and bool values)."""
    out: dict[str, Any] = {}
    for kv in kvs:
        which = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, which) if which is not None else None
    return out


def iter_points(metric: Metric) -> Iterator[Any]:
    """The data points of a metric, whatever its kind."""
    which = metric.WhichOneof("data")
    if which is None:
        return iter(())
    return iter(getattr(metric, which).data_points)
