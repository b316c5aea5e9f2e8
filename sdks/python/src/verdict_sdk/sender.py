"""The sender: one key and one body per signal, sent until verdict answers for good."""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Mapping

import httpx
from standardwebhooks.webhooks import Webhook

from .errors import ConfigError, KeyReusedError, NetworkError, RejectedError, UnavailableError
from .models import Decision, Signal, SignalOutcome
from .retry import Backoff, Disposition, parse_retry_after, wait_before_retry

#: Attempts per signal unless configured: enough to ride out a short outage.
DEFAULT_MAX_ATTEMPTS = 8
#: Per-attempt deadline, seconds; ingest includes an inline callback of up to 5 s.
DEFAULT_TIMEOUT = 30.0

log = logging.getLogger("verdict_sdk.sender")


@dataclass(frozen=True)
class _Reply:
    status: int
    retry_after: float | None
    replayed: bool
    body: Any


def new_idempotency_key() -> str:
    """A fresh UUIDv4: random, never derived from the signal, so two signals are two keys."""
    return str(uuid.uuid4())


def is_valid_key(key: str) -> bool:
    """1 to 255 visible ASCII characters, as verdict's contract requires."""
    return 1 <= len(key) <= 255 and all(0x21 <= ord(c) <= 0x7E for c in key)


def standard_webhooks_headers(secret: str, msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """`webhook-id`, `webhook-timestamp`, `webhook-signature`, signed by the reference library."""
    when = datetime.fromtimestamp(timestamp, tz=timezone.utc)
    signature = Webhook(secret).sign(msg_id, when, body.decode("utf-8"))
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature,
    }


class Sender:
    """Sends signals to one verdict deployment as one tenant.

    Every signal gets one UUIDv4 key (its `webhook-id` and `Idempotency-Key`) and is serialised
    once; each attempt posts those same bytes, signed afresh with the tenant's inbound secret.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        signing_secret: str | None,
        *,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        backoff: Backoff = Backoff(),
        timeout: float = DEFAULT_TIMEOUT,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if max_attempts < 1:
            raise ConfigError("max_attempts must be at least 1")
        if backoff.base > backoff.max:
            raise ConfigError("backoff base must not exceed its maximum")
        if not base_url.startswith(("http://", "https://")):
            raise ConfigError("base URL must be http or https")
        if signing_secret is not None:
            try:
                Webhook(signing_secret)  # Refuses an empty or malformed secret now, not per attempt.
            except Exception as error:
                raise ConfigError("the signing secret is not a whsec_ base64 secret") from error
        self._url = base_url.rstrip("/") + "/v1/signals"
        self._api_key = api_key
        self._secret = signing_secret
        self._max_attempts = max_attempts
        self._backoff = backoff
        self._sleep = sleep
        self._clock = clock
        # A redirected POST may become a GET or go elsewhere; the endpoint does not move.
        self._http = httpx.Client(timeout=timeout, follow_redirects=False)

    def __repr__(self) -> str:  # The API key and secret never reach a log line.
        return f"Sender(url={self._url!r}, signing={self._secret is not None})"

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Sender:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    @property
    def url(self) -> str:
        return self._url

    def send(self, signal: Signal | Mapping[str, Any]) -> SignalOutcome:
        """Serialises `signal` once and sends it under a fresh key."""
        body = signal.to_bytes() if isinstance(signal, Signal) else json.dumps(signal).encode("utf-8")
        return self.send_bytes(body)

    def send_bytes(self, body: bytes) -> SignalOutcome:
        """Sends a serialised signal under a fresh key, retrying with the same key and bytes."""
        return self._send(body, new_idempotency_key())

    def resend(self, body: bytes, idempotency_key: str) -> SignalOutcome:
        """Sends again a signal whose earlier send gave up: the key from that error, the same bytes.

        With a new key verdict would decide the signal a second time if the first send got through.
        """
        if not is_valid_key(idempotency_key):
            raise ConfigError("invalid idempotency key: it must be 1 to 255 visible ASCII characters")
        return self._send(body, idempotency_key)

    def _send(self, body: bytes, key: str) -> SignalOutcome:
        attempts = 0
        while True:
            attempts += 1
            retry = attempts - 1
            last = attempts >= self._max_attempts
            try:
                reply = self._attempt(body, key)
            except httpx.TransportError as error:
                if last:
                    raise NetworkError(attempts, key, error) from error
                delay = self._backoff.delay(retry)
                log.warning("signal attempt %d failed (%s); retrying in %.2fs", attempts, error, delay)
                self._sleep(delay)
                continue
            disposition = Disposition.of(reply.status)
            if disposition is Disposition.ACCEPTED:
                return SignalOutcome(
                    status=reply.status,
                    decision=Decision.from_json(reply.body),
                    replayed=reply.replayed,
                    idempotency_key=key,
                    attempts=attempts,
                )
            if disposition is Disposition.KEY_REUSED:
                raise KeyReusedError(key, reply.body)
            if disposition is Disposition.REJECTED:
                raise RejectedError(reply.status, reply.body)
            if last:
                raise UnavailableError(reply.status, attempts, key, reply.body)
            delay = wait_before_retry(disposition, reply.retry_after, self._backoff, retry)
            log.info("signal answered %d; retrying in %.2fs", reply.status, delay)
            self._sleep(delay)

    def _attempt(self, body: bytes, key: str) -> _Reply:
        """One POST of the same bytes under the same key."""
        headers = {
            "Authorization": f"Bearer {self._api_key}",
            "Content-Type": "application/json",
            "Idempotency-Key": key,
        }
        if self._secret is not None:
            # A fresh timestamp per attempt, so a retry after minutes is not refused as stale.
            headers |= standard_webhooks_headers(self._secret, key, int(self._clock()), body)
        response = self._http.post(self._url, content=body, headers=headers)
        return _Reply(
            status=response.status_code,
            retry_after=parse_retry_after(response.headers.get("retry-after")),
            replayed=response.headers.get("idempotent-replayed", "").strip().lower() == "true",
            body=_parse_body(response.content),
        )


def _parse_body(content: bytes) -> Any:
    """A response body as JSON; `None` when empty, the text when not JSON."""
    if not content:
        return None
    try:
        return json.loads(content)
    except ValueError:
        return content.decode("utf-8", errors="replace")
