"""An OTLP/HTTP trace receiver for the tests: decodes each export with the official
`opentelemetry-proto` package (PyPI) and writes what it got as JSON lines.

    python3 otlp_receiver.py OUT

Listens on 127.0.0.1 on a free port and prints the port on the first line of stdout. For each
request to /v1/traces it writes one line {"type": "request", "path", "content_type", "spans"},
then one line per span: {"type": "span", "service", "name", "kind", "trace_id", "span_id",
"parent_span_id", "attributes", "status"}, ids as lowercase hex ("" for no parent). A request
it cannot decode is answered 400 and written as {"type": "request", "error": ...}.
"""

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

OUT = open(sys.argv[1], "a", encoding="utf-8")
LOCK = threading.Lock()


def value(any_value):
    """An AnyValue as plain JSON."""
    kind = any_value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [value(v) for v in any_value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: value(kv.value) for kv in any_value.kvlist_value.values}
    if kind == "bytes_value":
        return any_value.bytes_value.hex()
    return getattr(any_value, kind)


def attributes(pairs):
    return {kv.key: value(kv.value) for kv in pairs}


def spans_of(export):
    for resource_spans in export.resource_spans:
        service = attributes(resource_spans.resource.attributes).get("service.name", "")
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                yield {
                    "type": "span",
                    "service": service,
                    "name": span.name,
                    "kind": Span.SpanKind.Name(span.kind),
                    "trace_id": span.trace_id.hex(),
                    "span_id": span.span_id.hex(),
                    "parent_span_id": span.parent_span_id.hex(),
                    "attributes": attributes(span.attributes),
                    "status": Status.StatusCode.Name(span.status.code),
                }


def write(lines):
    with LOCK:
        for line in lines:
            OUT.write(json.dumps(line) + "\n")
        OUT.flush()


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        request = {
            "type": "request",
            "path": self.path,
            "content_type": self.headers.get("content-type", ""),
        }
        try:
            export = ExportTraceServiceRequest.FromString(body)
        except DecodeError as err:
            write([dict(request, error=str(err))])
            self.send_response(400)
            self.end_headers()
            return
        spans = list(spans_of(export))
        write([dict(request, spans=len(spans))] + spans)
        answer = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
