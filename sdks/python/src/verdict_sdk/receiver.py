"""The receiver: verify the raw bytes, claim the `webhook-id`, run the handler once, answer.

| delivery | answer |
| --- | --- |
| missing, tampered or stale signature | 401 (verdict stops: any 4xx but 429 is final) |
| signed, but not an envelope | 400 |
| over the size limit | 413 |
| new: the handler ran | 204 |
| already processed | 204, the handler not called again |
| being handled by another request now | 503 with `Retry-After` (verdict retries) |
| the handler raised | 500: the claim is released, so verdict's retry is handled afresh |
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from .models import Envelope
from .store import Claim, DedupStore

#: The largest body accepted: 1 MiB. verdict's envelopes are a few KiB.
DEFAULT_MAX_BODY_BYTES = 1024 * 1024
#: How long a running handler holds its delivery before another may take it over: 5 minutes.
DEFAULT_HANDLER_LEASE = 300.0
#: What an in-flight duplicate is told to wait, in seconds.
IN_FLIGHT_RETRY_AFTER = 5

log = logging.getLogger("verdict_sdk.receiver")


@dataclass(frozen=True)
class Delivery:
    """A verified callback, handed to the handler once."""

    webhook_id: str
    envelope: Envelope
    #: The body exactly as received and verified.
    body: bytes


Handler = Callable[[Delivery], None]


@dataclass(frozen=True)
class Answer:
    """The HTTP answer to give verdict."""

    status: int
    headers: Mapping[str, str]
    body: str = ""


class InvalidSignature(Exception):
    """The delivery is not signed by any of the receiver's secrets, or not recently."""


class Receiver:
    """Verifies verdict callbacks with the tenant's webhook secrets and handles each id once."""

    def __init__(
        self,
        secrets: str | Sequence[str],
        store: DedupStore,
        *,
        handler_lease: float = DEFAULT_HANDLER_LEASE,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        names = [secrets] if isinstance(secrets, str) else list(secrets)
        if not names:
            raise ValueError("no webhook secret: add the tenant's (old and new during rotation)")
        self._webhooks = [Webhook(secret) for secret in names]
        self._store = store
        self._lease = handler_lease
        self._max_body_bytes = max_body_bytes
        self._clock = clock

    @property
    def max_body_bytes(self) -> int:
        return self._max_body_bytes

    def verify(self, headers: Mapping[str, str], body: bytes) -> Delivery:
        """The delivery, if one secret signed these exact bytes within the last 5 minutes."""
        lowered = {name.lower(): value for name, value in headers.items()}
        failure: Exception = InvalidSignature("no secret matched")
        for webhook in self._webhooks:
            try:
                webhook.verify(body, lowered, json_parse=False)
                break
            except (WebhookVerificationError, UnicodeDecodeError, ValueError) as error:
                failure = error
        else:
            raise InvalidSignature(str(failure)) from failure
        envelope = Envelope.from_json(json.loads(body))
        return Delivery(webhook_id=lowered["webhook-id"], envelope=envelope, body=body)

    def receive(self, headers: Mapping[str, str], body: bytes, handler: Handler) -> Answer:
        """Verifies, claims and handles one delivery; returns what to answer."""
        if len(body) > self._max_body_bytes:
            return _problem(413, "payload too large")
        try:
            delivery = self.verify(headers, body)
        except InvalidSignature as error:
            return _problem(401, f"invalid signature: {error}")
        except ValueError as error:
            return _problem(400, f"not a verdict envelope: {error}")
        now = self._clock()
        claim = self._store.claim(delivery.webhook_id, now, now + self._lease)
        if claim is Claim.DUPLICATE:
            log.debug("duplicate delivery %s answered without handling", delivery.webhook_id)
            return Answer(204, {})
        if claim is Claim.IN_FLIGHT:
            return Answer(503, {"Retry-After": str(IN_FLIGHT_RETRY_AFTER)}, "in progress")
        try:
            handler(delivery)
        except Exception:
            log.exception("handler failed for %s; verdict will retry it", delivery.webhook_id)
            self._store.release(delivery.webhook_id)
            return _problem(500, "handler failed")
        self._store.mark_processed(delivery.webhook_id, self._clock())
        return Answer(204, {})


def _problem(status: int, detail: str) -> Answer:
    return Answer(status, {"Content-Type": "text/plain; charset=utf-8"}, detail)
