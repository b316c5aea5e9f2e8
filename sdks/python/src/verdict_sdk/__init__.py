"""verdict's SDK: send identity-risk signals exactly once, receive signed callbacks once.

- `Sender`: one UUIDv4 key per signal, the same bytes on every retry, each attempt signed per
  Standard Webhooks with the tenant's inbound secret (`webhook-id` = the key).
- `Receiver`: verifies callbacks over the raw bytes, deduplicates on `webhook-id` in a
  `SqliteDedupStore`, and runs the handler once; `verdict_sdk.fastapi` and `verdict_sdk.flask`
  mount it.
"""

from .errors import (
    ConfigError,
    KeyReusedError,
    NetworkError,
    RejectedError,
    UnavailableError,
    VerdictError,
)
from .models import (
    AccountSubject,
    ActionResult,
    Decision,
    Envelope,
    PhoneSubject,
    Signal,
    SignalOutcome,
)
from .receiver import Answer, Delivery, InvalidSignature, Receiver
from .retry import Backoff, Disposition
from .sender import Sender, new_idempotency_key, standard_webhooks_headers
from .store import DEFAULT_HORIZON, Claim, DedupStore, SqliteDedupStore

__all__ = [
    "AccountSubject",
    "ActionResult",
    "Answer",
    "Backoff",
    "Claim",
    "ConfigError",
    "DEFAULT_HORIZON",
    "Decision",
    "DedupStore",
    "Delivery",
    "Disposition",
    "Envelope",
    "InvalidSignature",
    "KeyReusedError",
    "NetworkError",
    "PhoneSubject",
    "Receiver",
    "RejectedError",
    "Sender",
    "Signal",
    "SignalOutcome",
    "SqliteDedupStore",
    "UnavailableError",
    "VerdictError",
    "new_idempotency_key",
    "standard_webhooks_headers",
]
