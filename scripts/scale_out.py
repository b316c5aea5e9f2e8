#!/usr/bin/env python3
"""The checks of scripts/scale-out, against instances it started on one PostgreSQL database.

Standard library only. Reads from the environment:
  VERDICT_BIN          the verdict binary (for `tenant …` commands)
  VERDICT_DATABASE_URL, VERDICT_MASTER_KEY (inherited by the CLI)
  INSTANCES            comma-separated base URLs of the `verdict serve` processes
  BALANCER             base URL of the load balancer in front of them
  WORKER_LOGS          comma-separated log files of the `verdict worker` processes
  KEYS                 keys sent concurrently to every instance (check 1)
  COPIES               copies of each key per instance (check 1)
  SIGNALS              signals whose callbacks the workers retry (check 5)

Prints its counts; exits 1 if any check failed.
"""

import base64
import hashlib
import hmac
import http.server
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone

BIN = os.environ["VERDICT_BIN"]
DB = os.environ["VERDICT_DATABASE_URL"]
INSTANCES = os.environ["INSTANCES"].split(",")
BALANCER = os.environ["BALANCER"]
WORKER_LOGS = [p for p in os.environ.get("WORKER_LOGS", "").split(",") if p]
KEYS = int(os.environ.get("KEYS", "20"))
COPIES = int(os.environ.get("COPIES", "3"))
SIGNALS = int(os.environ.get("SIGNALS", "300"))
# "Every instance within 5 s", measured from the change to the sending of the first request
# that saw it.
WITHIN = 5.0
POLL = 0.1

failures = []


def say(msg):
    print(f"scale-out: {msg}", flush=True)


def check(ok, msg):
    say(("ok:   " if ok else "FAIL: ") + msg)
    if not ok:
        failures.append(msg)


# --- HTTP -----------------------------------------------------------------------------------------


def request(method, url, body=None, headers=None, timeout=30):
    """(status, headers (case-insensitive), body bytes); never raises for an HTTP status."""
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.headers, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers, err.read()


def observed_now():
    return (datetime.now(timezone.utc) - timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%SZ")


def signal_body(phone, signal_type="sim_swap"):
    return json.dumps(
        {"type": signal_type, "subject": {"phone": phone}, "observed_at": observed_now()}
    ).encode()


def sign(secret, body, key=None):
    """`Verdict-Signature`: `v2` over timestamp, idempotency key (empty without one) and body,
    which tenants require, and `v1` over timestamp and body, for tenants set up before that."""
    secret = base64.b64decode(secret.removeprefix("whsec_"))
    ts = str(int(time.time()))
    keyed = hmac.new(secret, f"{ts}.{key or ''}.".encode() + body, hashlib.sha256).digest()
    keyless = hmac.new(secret, ts.encode() + b"." + body, hashlib.sha256).digest()
    signature = f"v2,{base64.b64encode(keyed).decode()} v1,{base64.b64encode(keyless).decode()}"
    return {"Verdict-Timestamp": ts, "Verdict-Signature": signature}


def post_signal(base, tenant, body, key=None, secret=None):
    headers = {"Authorization": f"Bearer {tenant['api_key']}", "Content-Type": "application/json"}
    if key:
        headers["Idempotency-Key"] = key
    if secret:
        headers.update(sign(secret, body, key))
    return request("POST", f"{base}/v1/signals", body, headers)


_phones = iter(range(10**9))


def fresh_phone():
    return f"+44770{next(_phones) + 1000000:07d}"


# --- the CLI and the database ---------------------------------------------------------------------


def cli(*args):
    out = subprocess.run([BIN, *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"verdict {' '.join(args)}: {out.stderr}")
    return out.stdout


def tenant(*extra):
    return json.loads(cli("tenant", "create", "--name", "scale-out", "--json", *extra))


def sql(query):
    out = subprocess.run(["psql", DB, "-Atc", query], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"psql: {out.stderr}")
    return out.stdout.strip()


# --- a receiver that counts webhook-ids -----------------------------------------------------------


class Hooks:
    """Answers 503 to the first request of each webhook-id (so the workers must retry it) and 200
    after; counts every request per webhook-id."""

    def __init__(self):
        self.lock = threading.Lock()
        self.seen = Counter()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("content-length", "0")))
                webhook_id = self.headers.get("webhook-id", "")
                with outer.lock:
                    outer.seen[webhook_id] += 1
                    first = outer.seen[webhook_id] == 1
                self.send_response(503 if first else 200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def counts(self):
        with self.lock:
            return Counter(self.seen)


# --- the checks -----------------------------------------------------------------------------------


def same_key_everywhere(t):
    """Check 1: one key, sent concurrently to all three instances, COPIES times each: one event,
    one decision, every answer the same decision."""
    say(f"1. {KEYS} keys, each sent {COPIES}x concurrently to each of {len(INSTANCES)} instances")
    statuses = Counter()
    bad = []

    def one(base, key, body, barrier):
        barrier.wait()
        deadline = time.monotonic() + 30
        while True:
            status, headers, reply = post_signal(base, t, body, key=key)
            statuses[status] += 1
            if status != 409 or time.monotonic() > deadline:
                replayed = headers.get("Idempotent-Replayed") == "true"
                return status, replayed, reply
            # The contract's answer to a duplicate in flight: wait, retry with the same bytes.
            time.sleep(0.2)

    for _ in range(KEYS):
        key, body = str(uuid.uuid4()), signal_body(fresh_phone())
        senders = len(INSTANCES) * COPIES
        barrier = threading.Barrier(senders)
        with ThreadPoolExecutor(senders) as pool:
            futures = [
                pool.submit(one, base, key, body, barrier)
                for base in INSTANCES
                for _ in range(COPIES)
            ]
            results = [f.result() for f in futures]
        decided = {
            (json.loads(r)["event_id"], json.loads(r)["decision"]) for s, _, r in results if s == 200
        }
        fresh = sum(1 for s, replayed, _ in results if s == 200 and not replayed)
        if len(decided) != 1 or fresh != 1 or any(s != 200 for s, _, _ in results):
            bad.append((key, [s for s, _, _ in results], decided, fresh))
    events = int(sql(f"SELECT COUNT(*) FROM events WHERE tenant_id = '{t['tenant_id']}'"))
    keys = int(sql(f"SELECT COUNT(*) FROM idempotency_keys WHERE tenant_id = '{t['tenant_id']}'"))
    say(f"   requests by status {dict(statuses)}; events {events}, idempotency keys {keys}")
    check(not bad, f"every key got one decision, one fresh answer, the rest replays (bad: {bad[:3]})")
    check(events == KEYS, f"{KEYS} keys made {events} events")
    check(keys == KEYS, f"{KEYS} keys made {keys} idempotency key rows")


def playbook_reaches_every_instance(t):
    """Check 2: a playbook changed through one instance decides on every instance within 5 s."""
    say("2. a playbook changed through one instance, used by every instance")
    for round_, through in enumerate(INSTANCES[:2]):
        rule = f"scale_out_rule_{round_}"
        source = (
            f'[[rule]]\nname = "{rule}"\ndecision = "step_up"\nactions = ["callback"]\n'
        ).encode()
        status, _, reply = request(
            "PUT",
            f"{through}/v1/playbook",
            source,
            {"Authorization": f"Bearer {t['api_key']}", "Content-Type": "application/toml"},
        )
        check(status == 201, f"PUT /v1/playbook through {through}: {status}")
        if status != 201:
            continue
        version = json.loads(reply)["version"]
        changed = time.monotonic()
        for base in INSTANCES:
            took = None
            while time.monotonic() - changed < WITHIN + 5:
                sent = time.monotonic()
                status, _, reply = post_signal(base, t, signal_body(fresh_phone()), key=str(uuid.uuid4()))
                if status == 200:
                    decision = json.loads(reply)
                    if decision["playbook_version"] == version and decision["rule"] == rule:
                        took = sent - changed
                        break
                time.sleep(POLL)
            check(
                took is not None and took <= WITHIN,
                f"version {version} (changed through {through}) decides on {base} after "
                + (f"{took:.2f} s" if took is not None else "never"),
            )


def revoked_key_refused_everywhere(t):
    """Check 3: a key revoked with `verdict tenant key revoke` is refused by every instance within
    5 s, although each had it cached."""
    say("3. a key revoked with the CLI, refused by every instance")
    issued = json.loads(cli("tenant", "key", "create", "--tenant", t["tenant_id"], "--scope", "read", "--json"))
    auth = {"Authorization": f"Bearer {issued['api_key']}"}
    cached = {}
    for base in INSTANCES:
        cached[base] = time.monotonic()
        status, _, _ = request("GET", f"{base}/v1/events?limit=1", headers=auth)
        check(status == 200, f"the new read key works on {base} (and is cached there): {status}")
    cli("tenant", "key", "revoke", "--tenant", t["tenant_id"], "--key-id", issued["key_id"])
    revoked = time.monotonic()
    refused = dict.fromkeys(INSTANCES)
    # Every instance polled in turn, so each one's moment is seen to within a round of polls.
    while time.monotonic() - revoked < WITHIN + 5 and None in refused.values():
        for base in INSTANCES:
            if refused[base] is None:
                sent = time.monotonic()
                status, _, _ = request("GET", f"{base}/v1/events?limit=1", headers=auth)
                if status == 401:
                    refused[base] = sent
        time.sleep(POLL / 5)
    for base, at in refused.items():
        check(
            at is not None and at - revoked <= WITHIN,
            f"{base} refuses the revoked key "
            + (
                f"{at - revoked:.2f} s after the revocation ({at - cached[base]:.2f} s after it cached the key)"
                if at is not None
                else "never"
            ),
        )


def rotated_secret_honoured_everywhere(t):
    """Check 4: an inbound signing secret rotated with no grace, twice. The first time every
    instance is sent the new secret: each accepts it at once (a signature that matches no cached
    secret is checked against the stored ones). The second time every instance is sent only the
    old one, which each has cached: each refuses it within 5 s."""
    say("4. an inbound secret rotated (no grace), honoured by every instance")

    def rotate():
        out = cli("tenant", "rotate-secret", "--tenant", t["tenant_id"], "--grace-secs", "0", "--json")
        return json.loads(out)["secret"], time.monotonic()

    def until(secret, wanted, since):
        """When each instance first answered `wanted` to a signal signed with `secret`."""
        seen = dict.fromkeys(INSTANCES)
        while time.monotonic() - since < WITHIN + 5 and None in seen.values():
            for base in INSTANCES:
                if seen[base] is None:
                    sent = time.monotonic()
                    status, _, _ = post_signal(base, t, signal_body(fresh_phone()), secret=secret)
                    if status == wanted:
                        seen[base] = sent - since
            time.sleep(POLL / 5)
        return seen

    fmt = lambda s: f"{s:.2f} s" if s is not None else "never"  # noqa: E731
    old = t["signing_secret"]
    for base, at in until(old, 200, time.monotonic()).items():
        check(at is not None, f"the first secret works on {base} (and is cached there)")
    new, rotated = rotate()
    for base, at in until(new, 200, rotated).items():
        check(at is not None and at <= WITHIN, f"{base} accepts the new secret {fmt(at)} after the rotation")
    old = new
    newer, rotated = rotate()
    for base, at in until(old, 401, rotated).items():
        check(
            at is not None and at <= WITHIN,
            f"{base} refuses the rotated-out secret it had cached {fmt(at)} after the rotation",
        )
    for base, at in until(newer, 200, rotated).items():
        check(at is not None and at <= WITHIN, f"{base} accepts the newest secret")


def workers_never_send_twice(t, hooks):
    """Check 5: SIGNALS signals through the balancer; every inline callback is refused once (503),
    so the two workers retry them all from one queue: each webhook-id arrives exactly twice."""
    say(f"5. {SIGNALS} signals through the balancer; two workers retry their callbacks")

    def send(i):
        return post_signal(BALANCER, t, signal_body(fresh_phone(), "port_out"), key=str(uuid.uuid4()))[0]

    started = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        statuses = Counter(pool.map(send, range(SIGNALS)))
    say(f"   signals by status {dict(statuses)} in {time.monotonic() - started:.1f} s")
    check(statuses == Counter({200: SIGNALS}), f"all {SIGNALS} signals answered 200")
    spread = {}
    for base in INSTANCES:
        _, _, text = request("GET", f"{base}/metrics")
        m = re.search(rb"^verdict_signals_total (\d+)", text, re.M)
        spread[base] = int(m.group(1)) if m else 0
    say(f"   signals per instance (all checks): {spread}")
    check(all(n > 0 for n in spread.values()), "the balancer spread signals over every instance")

    # Every delivery of the run (all tenants) settles: the workers retry what the inline attempts
    # left pending.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        pending = int(sql("SELECT COUNT(*) FROM deliveries WHERE status <> 'succeeded'"))
        if pending == 0:
            break
        time.sleep(0.5)
    deliveries = int(sql("SELECT COUNT(*) FROM deliveries"))
    check(pending == 0, f"every delivery succeeded ({pending} of {deliveries} not, after the wait)")
    time.sleep(2)  # two more worker rounds: a double send would show now
    counts = hooks.counts()
    by_times = Counter(counts.values())
    twice_by_worker = int(
        sql(
            "SELECT COUNT(*) FROM (SELECT delivery_id FROM delivery_attempts WHERE trigger_kind = 'worker' "
            "GROUP BY delivery_id HAVING COUNT(*) > 1) AS d"
        )
    )
    worker_attempts = int(sql("SELECT COUNT(*) FROM delivery_attempts WHERE trigger_kind = 'worker'"))
    say(
        f"   deliveries {deliveries}; webhook-ids received {len(counts)}, requests {sum(counts.values())}, "
        f"ids by times received {dict(sorted(by_times.items()))}; worker attempts recorded {worker_attempts}"
    )
    per_worker = []
    for log in WORKER_LOGS:
        text = open(log, encoding="utf-8", errors="replace").read()
        per_worker.append(sum(int(n) for n in re.findall(r"attempted[=:\"]+(\d+)", text)))
    say(f"   attempts per worker process (from their logs): {per_worker}")
    check(len(counts) == deliveries, f"{len(counts)} webhook-ids for {deliveries} deliveries")
    check(set(counts.values()) == {2}, "every webhook-id arrived exactly twice (inline 503, one worker retry)")
    check(twice_by_worker == 0, f"no delivery attempted twice by the workers ({twice_by_worker})")
    check(worker_attempts == deliveries, f"{worker_attempts} worker attempts for {deliveries} deliveries")
    if len(per_worker) > 1 and min(per_worker) == 0:
        say("   note: one worker took every retry this run; the check above still holds")


def main():
    hooks = Hooks()
    say(f"instances {INSTANCES}, balancer {BALANCER}, receiver {hooks.url}")
    unsigned = tenant("--no-inbound-signature", "--callback-url", hooks.url)
    playbooks = tenant("--no-inbound-signature", "--callback-url", hooks.url)
    signed = tenant("--callback-url", hooks.url)
    load = tenant("--no-inbound-signature", "--callback-url", hooks.url)
    same_key_everywhere(unsigned)
    playbook_reaches_every_instance(playbooks)
    revoked_key_refused_everywhere(unsigned)
    rotated_secret_honoured_everywhere(signed)
    workers_never_send_twice(load, hooks)
    if failures:
        say(f"{len(failures)} check(s) failed:")
        for f in failures:
            say(f"  - {f}")
        sys.exit(1)
    say("every check passed")


if __name__ == "__main__":
    main()
