"""The receiver's claim rules, over a real SQLite file: once per id, across restarts."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
from standardwebhooks.webhooks import Webhook

from verdict_sdk import ConfigError, Delivery, Receiver, Sender, SqliteDedupStore

from conftest import corpus

CASE = corpus("envelopes.json")["cases"][0]
SECRET = CASE["webhook_secret"]


def _signed(msg_id: str) -> dict[str, str]:
    now = int(time.time())
    signature = Webhook(SECRET).sign(msg_id, datetime.fromtimestamp(now, tz=timezone.utc), CASE["body"])
    return {"Webhook-Id": msg_id, "Webhook-Timestamp": str(now), "Webhook-Signature": signature}


def test_an_id_is_handled_once_even_by_a_restarted_receiver(tmp_path: Path) -> None:
    handled: list[Delivery] = []
    first = Receiver(SECRET, SqliteDedupStore(tmp_path / "r.db"))
    assert first.receive(_signed("msg_1"), CASE["body"].encode(), handled.append).status == 204
    restarted = Receiver(SECRET, SqliteDedupStore(tmp_path / "r.db"))
    assert restarted.receive(_signed("msg_1"), CASE["body"].encode(), handled.append).status == 204
    assert [d.webhook_id for d in handled] == ["msg_1"]


def test_a_failing_handler_answers_500_and_the_retry_is_handled(tmp_path: Path) -> None:
    receiver = Receiver(SECRET, SqliteDedupStore(tmp_path / "r.db"))

    def failing(_: Delivery) -> None:
        raise RuntimeError("downstream is down")

    assert receiver.receive(_signed("msg_2"), CASE["body"].encode(), failing).status == 500
    handled: list[Delivery] = []
    assert receiver.receive(_signed("msg_2"), CASE["body"].encode(), handled.append).status == 204
    assert len(handled) == 1


def test_a_delivery_being_handled_asks_the_duplicate_to_retry_until_its_lease_ends(tmp_path: Path) -> None:
    store = SqliteDedupStore(tmp_path / "r.db")
    now = time.time()
    store.claim("msg_3", now, now + 300)  # Another request's handler holds it.
    receiver = Receiver(SECRET, store)
    answer = receiver.receive(_signed("msg_3"), CASE["body"].encode(), lambda _: None)
    assert answer.status == 503 and "Retry-After" in answer.headers
    # Its handler died: once the lease ends, the next delivery takes the event over.
    later = Receiver(SECRET, store, clock=lambda: now + 301)
    handled: list[Delivery] = []
    assert later.receive(_signed("msg_3"), CASE["body"].encode(), handled.append).status == 204
    assert len(handled) == 1


def test_a_processed_id_is_kept_for_the_horizon_then_pruned(tmp_path: Path) -> None:
    store = SqliteDedupStore(tmp_path / "r.db")
    now = time.time()
    store.claim("msg_4", now, now + 300)
    store.mark_processed("msg_4", now)
    assert store.prune(now + 71 * 3600) == 0
    assert store.prune(now + 73 * 3600) == 1


def test_a_horizon_shorter_than_verdicts_retries_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="horizon"):
        SqliteDedupStore(tmp_path / "r.db", horizon=600)


def test_an_oversized_body_is_refused_before_verifying(tmp_path: Path) -> None:
    receiver = Receiver(SECRET, SqliteDedupStore(tmp_path / "r.db"), max_body_bytes=16)
    assert receiver.receive(_signed("msg_5"), CASE["body"].encode(), lambda _: None).status == 413


def test_a_signed_body_that_is_not_an_envelope_is_a_400(tmp_path: Path) -> None:
    receiver = Receiver(SECRET, SqliteDedupStore(tmp_path / "r.db"))
    now = int(time.time())
    for body in ("[1, 2]", '{"event_id": "e"}', "not json"):
        signature = Webhook(SECRET).sign("msg_6", datetime.fromtimestamp(now, tz=timezone.utc), body)
        headers = {"webhook-id": "msg_6", "webhook-timestamp": str(now), "webhook-signature": signature}
        assert receiver.receive(headers, body.encode(), lambda _: None).status == 400, body


def test_an_unusable_signing_secret_is_refused_when_the_sender_is_built() -> None:
    with pytest.raises(ConfigError):
        Sender("http://127.0.0.1:9", "vk", "whsec_")
