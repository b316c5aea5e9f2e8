"""The signal verdict takes, the decision it answers with, and the callback envelope it sends."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal, Mapping, Union

SignalType = Literal["sim_swap", "port_out", "credential_breach"]
DecisionKind = Literal["allow", "step_up", "deny", "ignored"]
Feed = Literal["signals", "set", "camara"]


@dataclass(frozen=True)
class PhoneSubject:
    """A subject known by its phone number, in E.164 form (`+447700900123`)."""

    phone: str


@dataclass(frozen=True)
class AccountSubject:
    """A subject known by an account identifier of the tenant's own."""

    account: str


Subject = Union[PhoneSubject, AccountSubject]


@dataclass(frozen=True)
class Signal:
    """One identity-risk observation, the body of `POST /v1/signals`."""

    type: SignalType
    subject: Subject
    observed_at: datetime
    attributes: Mapping[str, Any] = field(default_factory=dict)
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The wire form: RFC 3339 time in UTC, the subject as `{"phone"}` or `{"account"}`."""
        subject = (
            {"phone": self.subject.phone}
            if isinstance(self.subject, PhoneSubject)
            else {"account": self.subject.account}
        )
        observed_at = self.observed_at
        if observed_at.tzinfo is None:
            raise ValueError("observed_at must be timezone-aware")
        return {
            "type": self.type,
            "subject": subject,
            "observed_at": observed_at.astimezone(timezone.utc).isoformat().replace("+00:00", "Z"),
            "attributes": dict(self.attributes),
            "metadata": dict(self.metadata),
        }

    def to_bytes(self) -> bytes:
        """Serialised once per signal: every retry must carry these same bytes."""
        return json.dumps(self.to_json(), separators=(",", ":")).encode("utf-8")


@dataclass(frozen=True)
class ActionResult:
    """One action of a decision and how it went (`done`, `already_done`, `pending`, ...)."""

    action: str
    outcome: str
    connector: str | None = None

    @staticmethod
    def from_json(value: Mapping[str, Any]) -> ActionResult:
        return ActionResult(
            action=str(value["action"]),
            outcome=str(value["outcome"]),
            connector=value.get("connector"),
        )


@dataclass(frozen=True)
class Decision:
    """verdict's answer to a signal: the same on every retry of its key."""

    event_id: str
    subject_hash: str
    decision: DecisionKind
    playbook_version: int
    rule: str
    actions: tuple[ActionResult, ...]

    @staticmethod
    def from_json(value: Mapping[str, Any]) -> Decision:
        return Decision(
            event_id=str(value["event_id"]),
            subject_hash=str(value["subject_hash"]),
            decision=value["decision"],
            playbook_version=int(value["playbook_version"]),
            rule=str(value["rule"]),
            actions=tuple(ActionResult.from_json(a) for a in value.get("actions", [])),
        )


@dataclass(frozen=True)
class SignalOutcome:
    """A signal verdict accepted: its decision, and how it got there."""

    status: int
    decision: Decision
    replayed: bool
    idempotency_key: str
    attempts: int


@dataclass(frozen=True)
class Envelope:
    """A decision callback, as verdict sends it byte for byte the same on every attempt."""

    event_id: str
    tenant: str
    event_type: str
    subject_hash: str
    timestamp: str
    decision: str
    actions: Any
    metadata: Any
    feed: str = "signals"

    @staticmethod
    def from_json(value: Mapping[str, Any]) -> Envelope:
        """Parses an envelope; envelopes from before feeds existed lack `feed` and read as `signals`."""
        if not isinstance(value, Mapping):
            raise ValueError("not a verdict envelope: not a JSON object")
        required = ("event_id", "tenant", "event_type", "subject_hash", "timestamp", "decision")
        missing = [name for name in required if not isinstance(value.get(name), str)]
        if missing or "actions" not in value or "metadata" not in value:
            raise ValueError(f"not a verdict envelope: missing or mistyped {missing or 'actions/metadata'}")
        return Envelope(
            event_id=value["event_id"],
            tenant=value["tenant"],
            event_type=value["event_type"],
            subject_hash=value["subject_hash"],
            timestamp=value["timestamp"],
            decision=value["decision"],
            actions=value["actions"],
            metadata=value["metadata"],
            feed=str(value.get("feed", "signals")),
        )
