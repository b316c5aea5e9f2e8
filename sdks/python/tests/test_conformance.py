"""The shared corpus (sdks/conformance) against the Python SDK: signatures, envelopes, retries."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

import pytest
from standardwebhooks.webhooks import Webhook

from verdict_sdk import (
    Backoff,
    Envelope,
    KeyReusedError,
    NetworkError,
    Receiver,
    RejectedError,
    Sender,
    SqliteDedupStore,
    UnavailableError,
    standard_webhooks_headers,
)

from conftest import corpus, free_port

SIGNATURES = corpus("signatures.json")["cases"]
ENVELOPES = corpus("envelopes.json")["cases"]
RETRIES = corpus("retries.json")
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
DECISION = {"event_id": "e-1", "subject_hash": "ab", "decision": "deny", "playbook_version": 1,
            "rule": "fresh_sim_swap", "actions": [{"action": "lock_account", "outcome": "done"}]}
ERRORS = {"key_reused": KeyReusedError, "rejected": RejectedError, "unavailable": UnavailableError}


@pytest.mark.parametrize("case", SIGNATURES, ids=[c["name"] for c in SIGNATURES])
def test_the_sender_signs_each_corpus_case_as_the_reference_did(case: dict[str, Any]) -> None:
    headers = standard_webhooks_headers(case["secret"], case["id"], case["timestamp"], case["body"].encode())
    assert headers == {"webhook-id": case["id"], "webhook-timestamp": str(case["timestamp"]),
                       "webhook-signature": case["expected"]}


@pytest.mark.parametrize("case", ENVELOPES, ids=[c["name"] for c in ENVELOPES])
def test_each_envelope_verdict_sent_verifies_parses_and_is_refused_when_stale(
    case: dict[str, Any], tmp_path: Any
) -> None:
    body, headers, secret = case["body"].encode(), case["headers"], case["webhook_secret"]
    # verdict's signature is the one the reference library makes over the same bytes.
    reference = Webhook(secret).sign(headers["webhook-id"], _utc(int(headers["webhook-timestamp"])), case["body"])
    assert reference in headers["webhook-signature"].split(" ")
    receiver = Receiver(secret, SqliteDedupStore(tmp_path / "r.db"))
    handled: list[Envelope] = []
    # The same bytes, signed now, are taken once and parse as the corpus says.
    fresh = _signed_at(secret, headers["webhook-id"], int(time.time()), case["body"])
    assert receiver.receive(fresh, body, lambda d: handled.append(d.envelope)).status == 204
    assert handled == [Envelope.from_json(case["envelope"])]
    # Signed 301 s ago they are a replay, refused before the dedupe store is consulted.
    stale = _signed_at(secret, "msg_stale", int(time.time()) - 301, case["body"])
    assert receiver.receive(stale, body, lambda d: handled.append(d.envelope)).status == 401
    assert len(handled) == 1


def _signed_at(secret: str, msg_id: str, timestamp: int, body: str) -> dict[str, str]:
    return {"webhook-id": msg_id, "webhook-timestamp": str(timestamp),
            "webhook-signature": Webhook(secret).sign(msg_id, _utc(timestamp), body)}


@dataclass
class Script:
    """The stub's answers, in order (the last repeats), and every request it got."""

    answers: list[tuple[int, str | None]]
    requests: list[tuple[dict[str, str], bytes]] = field(default_factory=list)


class _Stub(BaseHTTPRequestHandler):
    script: Script

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers["content-length"]))
        script = self.server.script  # type: ignore[attr-defined]
        script.requests.append(({k.lower(): v for k, v in self.headers.items()}, body))
        status, retry_after = script.answers[min(len(script.requests), len(script.answers)) - 1]
        payload = json.dumps(DECISION if status < 300 else {"type": "about:blank", "title": f"status {status}"})
        self.send_response(status)
        if retry_after is not None:
            self.send_header("Retry-After", retry_after)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload.encode())

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture(scope="module")
def stub() -> Iterator[tuple[str, ThreadingHTTPServer]]:
    """A scripted stand-in for verdict on 127.0.0.1: real HTTP, answers from the corpus."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
    # One server for the module: each test swaps in its own script.
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}", server
    server.shutdown()


def _sender(base: str, waits: list[float], max_attempts: int = 8) -> Sender:
    backoff = RETRIES["backoff"]
    return Sender(base, "vk_test", SECRET, max_attempts=max_attempts,
                  backoff=Backoff(backoff["base_seconds"], backoff["max_seconds"]), sleep=waits.append)


def _run(sender: Sender, script: Script, expect: dict[str, Any]) -> None:
    body = b'{"type":"sim_swap","subject":{"phone":"+447700900123"},"observed_at":"2026-05-28T12:00:00Z"}'
    if expect["outcome"] == "accepted":
        outcome = sender.send_bytes(body)
        assert outcome.attempts == expect["attempts"]
        assert outcome.decision.decision == "deny"
    else:
        with pytest.raises(ERRORS[expect["error"]]) as raised:
            sender.send_bytes(body)
        if expect["error"] == "key_reused":
            assert "key-generation bug" in str(raised.value)
    assert len(script.requests) == expect["attempts"]
    _assert_same_bytes_and_key(script.requests, body)


def _assert_same_bytes_and_key(requests: list[tuple[dict[str, str], bytes]], body: bytes) -> None:
    keys = {headers["webhook-id"] for headers, _ in requests}
    assert len(keys) == 1, f"the key changed between attempts: {keys}"
    for headers, sent in requests:
        assert sent == body
        assert headers["idempotency-key"] == headers["webhook-id"]
        Webhook(SECRET).verify(sent, headers, json_parse=False)


@pytest.mark.parametrize("case", RETRIES["cases"], ids=[c["name"] for c in RETRIES["cases"]])
def test_the_sender_answers_each_status_as_the_corpus_says(
    case: dict[str, Any], stub: tuple[str, ThreadingHTTPServer]
) -> None:
    base, server = stub
    script = Script([(case["status"], case["retry_after"]), (200, None)])
    server.script = script  # type: ignore[attr-defined]
    waits: list[float] = []
    _run(_sender(base, waits), script, case["expect"])
    wait = case["expect"].get("wait")
    if wait is None:
        assert waits == []
    else:
        assert len(waits) == 1 and wait["at_least"] <= waits[0] <= wait["at_most"], waits


@pytest.mark.parametrize("case", RETRIES["sequences"], ids=[c["name"] for c in RETRIES["sequences"]])
def test_the_sender_follows_each_corpus_sequence(case: dict[str, Any], stub: tuple[str, ThreadingHTTPServer]) -> None:
    base, server = stub
    script = Script([(status, None) for status in case["statuses"]])
    server.script = script  # type: ignore[attr-defined]
    waits: list[float] = []
    _run(_sender(base, waits, case["max_attempts"]), script, case["expect"])
    ceilings = case["expect"]["waits_at_most"]
    assert len(waits) == len(ceilings)
    assert all(0 <= w <= c for w, c in zip(waits, ceilings)), waits


def test_network_errors_back_off_boundedly_then_carry_the_key_for_a_resend() -> None:
    waits: list[float] = []
    sender = _sender(f"http://127.0.0.1:{free_port()}", waits, max_attempts=3)
    with pytest.raises(NetworkError) as raised:
        sender.send_bytes(b"{}")
    assert raised.value.attempts == 3
    assert len(waits) == 2 and all(0 <= w <= 1.0 for w in waits)
    assert len(raised.value.idempotency_key) == 36


def _utc(timestamp: int) -> Any:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(timestamp, tz=timezone.utc)
