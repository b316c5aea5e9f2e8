"""What each answer means, and how long to wait before the next attempt.

Network errors, 5xx and 429 back off exponentially with full jitter (the server's
`Retry-After` is a floor); 409 (the same signal still in flight) waits `Retry-After`; 422 is a
key-generation bug; any other 4xx is final.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import Enum

#: Wait on 409 when the server gives no `Retry-After`; the server sends 2 s itself.
DEFAULT_IN_FLIGHT_WAIT = 2.0
#: The longest `Retry-After` honoured; a larger value waits this long instead.
MAX_RETRY_AFTER = 60.0


class Disposition(str, Enum):
    """The next step an answer calls for."""

    ACCEPTED = "accepted"
    IN_FLIGHT = "in_flight"
    KEY_REUSED = "key_reused"
    TRANSIENT = "transient"
    REJECTED = "rejected"

    @staticmethod
    def of(status: int) -> Disposition:
        if 200 <= status < 300:
            return Disposition.ACCEPTED
        if status == 409:
            return Disposition.IN_FLIGHT
        if status == 422:
            return Disposition.KEY_REUSED
        # 429 is answered before the key is claimed, so retrying is safe and expected.
        if status == 429 or status >= 500:
            return Disposition.TRANSIENT
        return Disposition.REJECTED


@dataclass(frozen=True)
class Backoff:
    """Full jitter: retry `n` waits a uniform time in `[0, min(max, base * 2**n)]`.

    Full jitter spreads out senders that failed together, so they do not retry in lockstep.
    """

    base: float = 0.25
    max: float = 30.0

    def ceiling(self, retry: int) -> float:
        factor: int = 2 ** min(retry, 62)
        return min(self.max, self.base * factor)

    def delay(self, retry: int) -> float:
        return random.uniform(0.0, self.ceiling(retry))


def parse_retry_after(value: str | None) -> float | None:
    """`Retry-After` in delta-seconds; an HTTP date or anything else counts as absent."""
    if value is None:
        return None
    text = value.strip()
    return float(text) if text.isdigit() else None


def wait_before_retry(
    disposition: Disposition, retry_after: float | None, backoff: Backoff, retry: int
) -> float:
    """Seconds to wait before retry number `retry` (0 for the first retry)."""
    capped = None if retry_after is None else min(retry_after, MAX_RETRY_AFTER)
    if disposition is Disposition.IN_FLIGHT:
        return DEFAULT_IN_FLIGHT_WAIT if capped is None else capped
    # The server's hint is a floor: never retry sooner than it asked.
    return max(backoff.delay(retry), capped or 0.0)
