"""Where received `webhook-id`s are remembered, so a redelivery is recognised and answered 2xx
without running the handler again.

One row per delivery: the id, when it arrived, until when its handler holds it, and when it
was processed. A processed id is kept for the horizon (72 h by default), well past verdict's
retry schedule (one inline attempt, then 3 worker attempts 5 minutes apart) and the hours or a
weekend after which an operator may redeliver a dead delivery by hand, with the same id.
"""

from __future__ import annotations

import sqlite3
import threading
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Iterator, Protocol

#: How long a processed id is remembered: 72 hours.
DEFAULT_HORIZON = 72 * 3600.0
#: The shortest horizon accepted: an hour, past verdict's retries (about 20 minutes, longer
#: when a receiver's `Retry-After` asks for it) with margin.
MIN_HORIZON = 3600.0
#: How often expired ids are pruned, opportunistically while claiming: hourly.
PRUNE_INTERVAL = 3600.0


class Claim(str, Enum):
    """What claiming a `webhook-id` found."""

    #: Not seen (or its earlier handler's lease ran out): run the handler.
    NEW = "new"
    #: Already processed: answer 2xx, do not run the handler.
    DUPLICATE = "duplicate"
    #: Another delivery of it is being handled right now: ask verdict to retry later.
    IN_FLIGHT = "in_flight"


class DedupStore(Protocol):
    """A store the receiver claims ids in; a claim must be atomic across processes sharing it."""

    def claim(self, webhook_id: str, now: float, lease_until: float) -> Claim: ...

    def mark_processed(self, webhook_id: str, now: float) -> None: ...

    def release(self, webhook_id: str) -> None: ...


class SqliteDedupStore:
    """Ids in a SQLite file: outlives restarts, shared by the processes on one host."""

    def __init__(self, path: str | Path, *, horizon: float = DEFAULT_HORIZON) -> None:
        if horizon < MIN_HORIZON:
            raise ValueError(
                f"the horizon must be at least {MIN_HORIZON:.0f} s: shorter would forget ids "
                "verdict may still retry or redeliver"
            )
        self._path = str(path)
        self._horizon = horizon
        self._last_prune = float("-inf")
        self._prune_lock = threading.Lock()
        with self._connect() as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(
                "CREATE TABLE IF NOT EXISTS verdict_received_webhooks ("
                " webhook_id TEXT PRIMARY KEY,"
                " received_at REAL NOT NULL,"
                " lease_until REAL NOT NULL,"
                " processed_at REAL)"
            )

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        # A connection per call: safe from any thread, and the file is the only shared state.
        db = sqlite3.connect(self._path, timeout=5.0, isolation_level=None)
        try:
            yield db
        finally:
            db.close()

    def claim(self, webhook_id: str, now: float, lease_until: float) -> Claim:
        self._prune_if_due(now)
        with self._connect() as db:
            # IMMEDIATE takes the write lock first, so two deliveries of one id cannot both win.
            db.execute("BEGIN IMMEDIATE")
            try:
                claim = _claim_of(self._row(db, webhook_id), now)
                if claim is Claim.NEW:
                    db.execute(
                        "INSERT INTO verdict_received_webhooks (webhook_id, received_at, lease_until)"
                        " VALUES (?, ?, ?) ON CONFLICT (webhook_id) DO UPDATE SET"
                        " received_at = excluded.received_at, lease_until = excluded.lease_until",
                        (webhook_id, now, lease_until),
                    )
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
            return claim

    @staticmethod
    def _row(db: sqlite3.Connection, webhook_id: str) -> tuple[float, float | None] | None:
        row: tuple[float, float | None] | None = db.execute(
            "SELECT lease_until, processed_at FROM verdict_received_webhooks WHERE webhook_id = ?",
            (webhook_id,),
        ).fetchone()
        return row

    def mark_processed(self, webhook_id: str, now: float) -> None:
        with self._connect() as db:
            db.execute(
                "UPDATE verdict_received_webhooks SET processed_at = ? WHERE webhook_id = ?",
                (now, webhook_id),
            )

    def release(self, webhook_id: str) -> None:
        with self._connect() as db:
            db.execute(
                "DELETE FROM verdict_received_webhooks WHERE webhook_id = ? AND processed_at IS NULL",
                (webhook_id,),
            )

    def prune(self, now: float) -> int:
        """Forgets processed ids older than the horizon; returns how many."""
        with self._connect() as db:
            cursor = db.execute(
                "DELETE FROM verdict_received_webhooks WHERE processed_at IS NOT NULL AND received_at < ?",
                (now - self._horizon,),
            )
            return cursor.rowcount

    def _prune_if_due(self, now: float) -> None:
        with self._prune_lock:
            if now - self._last_prune < PRUNE_INTERVAL:
                return
            self._last_prune = now
        self.prune(now)


def _claim_of(row: tuple[float, float | None] | None, now: float) -> Claim:
    if row is None:
        return Claim.NEW
    lease_until, processed_at = row
    if processed_at is not None:
        return Claim.DUPLICATE
    # A handler whose lease ran out died mid-way: this delivery takes the event over.
    return Claim.NEW if lease_until <= now else Claim.IN_FLIGHT
