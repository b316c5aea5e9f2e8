"""The SDK against the real `verdict` binary: signals sent with the Sender, callbacks received
by the Receiver in FastAPI and in Flask, over real HTTP on 127.0.0.1."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from typing import Any

import httpx
import pytest
from standardwebhooks.webhooks import Webhook

from verdict_sdk import KeyReusedError, PhoneSubject, Sender, Signal

from conftest import Stack, corpus

CONFLICTS = corpus("conflicts.json")["cases"]


def _sender(stack: Stack) -> Sender:
    tenant = stack.verdict.tenant
    return Sender(stack.verdict.base, tenant.api_key, tenant.signing_secret, max_attempts=3)


def _signal(phone: str) -> Signal:
    return Signal(type="sim_swap", subject=PhoneSubject(phone), observed_at=datetime.now(timezone.utc),
                  metadata={"ticket": f"T-{phone[-3:]}"})


def _delivery_of(stack: Stack, event_id: str) -> dict[str, Any]:
    page = stack.verdict.get("/v1/deliveries?limit=500")
    deliveries = [d for d in page["data"] if d["event_id"] == event_id and d["action"] == "callback"]
    assert len(deliveries) == 1, page
    return deliveries[0]


def test_one_decision_per_key_and_a_retry_gets_the_same_decision(stack: Stack) -> None:
    signal = _signal("+447700900301")
    with _sender(stack) as sender:
        first = sender.send(signal)
        again = sender.resend(signal.to_bytes(), first.idempotency_key)
    assert first.status == 200 and not first.replayed
    assert again.replayed and again.decision == first.decision
    assert again.idempotency_key == first.idempotency_key
    events = [e for e in stack.verdict.get("/v1/events?limit=100")["data"] if e["id"] == first.decision.event_id]
    assert len(events) == 1


def test_the_callback_is_received_once_and_a_redelivery_is_answered_without_the_handler(stack: Stack) -> None:
    with _sender(stack) as sender:
        outcome = sender.send(_signal("+447700900302"))
    event_id = outcome.decision.event_id
    [delivery] = stack.handled.wait_for(event_id)
    assert delivery.envelope.decision == outcome.decision.decision
    assert delivery.envelope.subject_hash == outcome.decision.subject_hash
    assert delivery.envelope.metadata == {"ticket": "T-302"}

    # verdict sends it again, same webhook-id: the receiver answers 2xx and skips the handler.
    record = _delivery_of(stack, event_id)
    assert record["webhook_id"] == delivery.webhook_id
    # The inline attempt's record lands after the response (within 25 ms): until then the
    # delivery is still leased to it, and a redelivery is refused.
    deadline = time.monotonic() + 10
    while record["status"] == "pending" and time.monotonic() < deadline:
        time.sleep(0.02)
        record = stack.verdict.get(f"/v1/deliveries/{record['id']}")
    assert record["status"] == "succeeded", record
    assert stack.verdict.post(f"/v1/deliveries/{record['id']}/redeliver").status_code in (200, 202)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        attempts = stack.verdict.get(f"/v1/deliveries/{record['id']}")["attempts"]
        if len(attempts) >= 2:
            break
        time.sleep(0.1)
    assert [a["status_code"] for a in attempts] == [204, 204], attempts
    assert len(stack.handled.of_event(event_id)) == 1


def test_the_receiver_refuses_tampered_stale_and_unsigned_deliveries(stack: Stack) -> None:
    with _sender(stack) as sender:
        outcome = sender.send(_signal("+447700900303"))
    [delivery] = stack.handled.wait_for(outcome.decision.event_id)
    secret = stack.verdict.tenant.webhook_secret
    body = delivery.body.decode()

    def post(headers: dict[str, str], content: str) -> int:
        return httpx.post(stack.receiver_url, content=content.encode(), headers=headers).status_code

    now = int(time.time())
    fresh = _signed(secret, "msg_replayed", now, body)
    tampered = body.replace(delivery.envelope.decision, "allow" if delivery.envelope.decision != "allow" else "deny")
    assert post(fresh, tampered) == 401
    assert post(_signed(secret, "msg_stale", now - 301, body), body) == 401
    assert post({"webhook-id": "msg_unsigned"}, body) == 401
    assert post(_signed("whsec_" + "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo=", "msg_other", now, body), body) == 401
    # The genuine one, sent again by hand under its own id: a duplicate, answered 2xx.
    assert post(_signed(secret, delivery.webhook_id, now, body), body) == 204
    assert len(stack.handled.of_event(outcome.decision.event_id)) == 1


@pytest.mark.parametrize("case", CONFLICTS, ids=[c["name"] for c in CONFLICTS])
def test_one_key_resent_with_each_corpus_body(stack: Stack, case: dict[str, Any]) -> None:
    observed_at = (datetime.now(timezone.utc) - timedelta(seconds=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    first, second = (case[k].replace("{observed_at}", observed_at) for k in ("first", "second"))
    with _sender(stack) as sender:
        original = sender.send_bytes(first.encode())
        expect = case["expect"]
        if expect["outcome"] == "replayed":
            replay = sender.resend(second.encode(), original.idempotency_key)
            assert replay.replayed and replay.decision == original.decision
            return
        with pytest.raises(KeyReusedError) as raised:
            sender.resend(second.encode(), original.idempotency_key)
    assert "key-generation bug" in str(raised.value)
    assert raised.value.problem["type"] == expect["problem_type"]
    assert raised.value.idempotency_key == original.idempotency_key


def _signed(secret: str, msg_id: str, timestamp: int, body: str) -> dict[str, str]:
    when = datetime.fromtimestamp(timestamp, tz=timezone.utc)
    return {"webhook-id": msg_id, "webhook-timestamp": str(timestamp),
            "webhook-signature": Webhook(secret).sign(msg_id, when, body), "content-type": "application/json"}
