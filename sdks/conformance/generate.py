"""Writes the corpus's generated files: signatures.json, from the reference Standard Webhooks
library (PyPI `standardwebhooks`), never from verdict's own code; and envelopes.json, callbacks
captured from a real `verdict serve` (its bytes, headers and webhook secret).

    python3 sdks/conformance/generate.py [path/to/verdict]

Run it again only to change the cases; the tests read the files, they do not regenerate them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from standardwebhooks.webhooks import Webhook

HERE = Path(__file__).resolve().parent

# The published test vector of the Standard Webhooks specification.
VECTOR = {
    "secret": "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD",
    "id": "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk",
    "timestamp": 1649367553,
    "body": '{"email":"test@example.com","username":"test_user"}',
}

SIGNAL_BODY = (
    '{"type":"sim_swap","subject":{"phone":"+447700900123"},'
    '"observed_at":"2026-05-28T12:00:00Z","attributes":{},"metadata":{"ticket":"T-1"}}'
)


def reference_signature(secret: str, msg_id: str, timestamp: int, body: str) -> str:
    return Webhook(secret).sign(msg_id, datetime.fromtimestamp(timestamp, tz=timezone.utc), body)


def signature_cases() -> list[dict[str, Any]]:
    inputs = [
        {"name": "the published Standard Webhooks vector", **VECTOR},
        {
            "name": "an inbound signal as the SDKs send it: webhook-id is the UUIDv4 idempotency key",
            "secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "id": "5f0d7a0e-2b7c-4c55-9d2e-6a4f1c3b8e21",
            "timestamp": 1780000000,
            "body": SIGNAL_BODY,
        },
        {
            "name": "multi-byte characters, CR LF and a tab are signed as UTF-8 bytes, unchanged",
            "secret": "whsec_dGVzdCBzZWNyZXQgZm9yIHVuaWNvZGUgYm9kaWVz",
            "id": "msg_unicode",
            "timestamp": 1780000001,
            "body": '{"name":"Zoë Ångström 名前 🚀",\n"note":"line1\r\nline2\\n\t"}\n',
        },
        {
            "name": "an empty body",
            "secret": "whsec_ZW1wdHkgYm9keSBzZWNyZXQ=",
            "id": "msg_empty",
            "timestamp": 1780000002,
            "body": "",
        },
        {
            "name": "a secret whose base64 lacks its padding",
            "secret": "whsec_YSAzMS1ieXRlIGtleSBuZWVkaW5nIGI2NCBwYWQhIQ",
            "id": "msg_unpadded",
            "timestamp": 1780000003,
            "body": '{"decision":"deny"}',
        },
    ]
    return [{**case, "expected": reference_signature(case["secret"], case["id"], case["timestamp"], case["body"])}
            for case in inputs]


class Capture(BaseHTTPRequestHandler):
    """Answers 204 to every callback and keeps its headers and raw bytes."""

    received: list[dict[str, Any]] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers["content-length"]))
        Capture.received.append({
            "webhook-id": self.headers["webhook-id"],
            "webhook-timestamp": self.headers["webhook-timestamp"],
            "webhook-signature": self.headers["webhook-signature"],
            "body": body.decode("utf-8"),
        })
        self.send_response(204)
        self.end_headers()

    def log_message(self, *_: Any) -> None:
        pass


def envelope_cases(verdict: str) -> list[dict[str, Any]]:
    capture = ThreadingHTTPServer(("127.0.0.1", 0), Capture)
    threading.Thread(target=capture.serve_forever, daemon=True).start()
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "VERDICT_DATABASE_URL": f"sqlite://{tmp}/verdict.db",
               "VERDICT_ALLOW_PRIVATE_DESTINATIONS": "1"}
        url = f"http://127.0.0.1:{capture.server_port}/"
        tenant = json.loads(subprocess.run(
            [verdict, "tenant", "create", "--name", "conformance", "--callback-url", url, "--json"],
            env=env, check=True, capture_output=True, text=True).stdout)
        server = subprocess.Popen([verdict, "serve", "--listen", "127.0.0.1:0"], env=env,
                                  stderr=subprocess.PIPE, text=True)
        try:
            base = _listening(server)
            now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            signals = [
                {"type": "sim_swap", "subject": {"phone": "+447700900123"}, "observed_at": now,
                 "metadata": {"ticket": "T-1"}},
                {"type": "port_out", "subject": {"account": "acct-42"}, "observed_at": now},
                {"type": "credential_breach", "subject": {"phone": "+447700900124"}, "observed_at": now,
                 "attributes": {"severity": "high"}, "metadata": {}},
            ]
            for signal in signals:
                _send(base, tenant, json.dumps(signal, separators=(",", ":")))
            deadline = time.time() + 10
            while len(Capture.received) < len(signals) and time.time() < deadline:
                time.sleep(0.1)
        finally:
            server.terminate()
            server.wait()
    capture.shutdown()
    return [{"name": f"a {json.loads(c['body'])['event_type']} callback", "webhook_secret": tenant["webhook_secret"],
             "headers": {k: c[k] for k in ("webhook-id", "webhook-timestamp", "webhook-signature")},
             "body": c["body"], "envelope": json.loads(c["body"])}
            for c in Capture.received]


def _listening(server: subprocess.Popen[str]) -> str:
    assert server.stderr is not None
    for line in server.stderr:
        if "listening on http://" in line:
            rest = line.split("listening on http://", 1)[1]
            return "http://" + "".join(ch for ch in rest if ch.isdigit() or ch in ".:")
    raise SystemExit("verdict serve did not start")


def _send(base: str, tenant: dict[str, str], body: str) -> None:
    import httpx

    key, ts = str(uuid.uuid4()), int(time.time())
    response = httpx.post(f"{base}/v1/signals", content=body, headers={
        "Authorization": f"Bearer {tenant['api_key']}", "Content-Type": "application/json",
        "webhook-id": key, "webhook-timestamp": str(ts),
        "webhook-signature": reference_signature(tenant["signing_secret"], key, ts, body)})
    response.raise_for_status()


def write(name: str, about: str, cases: list[dict[str, Any]]) -> None:
    document = {"about": about, "generated_by": "sdks/conformance/generate.py", "cases": cases}
    (HERE / name).write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def main() -> None:
    write("signatures.json",
          "Standard Webhooks signatures: v1,base64(HMAC-SHA256(secret bytes, '{id}.{timestamp}.{body}')), "
          "the expected value made by the reference library (PyPI standardwebhooks).",
          signature_cases())
    if len(sys.argv) > 1:
        write("envelopes.json",
              "Callbacks as a real verdict sent them: the exact body, its Standard Webhooks headers and "
              "the tenant's webhook secret (a throwaway test tenant's), and the body parsed.",
              envelope_cases(sys.argv[1]))


if __name__ == "__main__":
    main()
