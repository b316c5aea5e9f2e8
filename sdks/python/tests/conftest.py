"""Fixtures: the corpus, a real `verdict serve` on a free loopback port with SQLite in a temp
dir, and the SDK's receiver mounted in FastAPI (uvicorn) or Flask (werkzeug) on 127.0.0.1."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from flask import Flask
from werkzeug.serving import make_server

from verdict_sdk import Delivery, Receiver, SqliteDedupStore
from verdict_sdk.fastapi import fastapi_endpoint
from verdict_sdk.flask import flask_view

REPO = Path(__file__).resolve().parents[3]
CONFORMANCE = REPO / "sdks" / "conformance"


def corpus(name: str) -> dict[str, Any]:
    """One corpus file, as every language's tests read it."""
    document: dict[str, Any] = json.loads((CONFORMANCE / name).read_text(encoding="utf-8"))
    return document


def verdict_binary() -> Path:
    """`VERDICT_BIN`, else the debug build; a missing binary fails the run, never skips it."""
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    binary = Path(os.environ.get("VERDICT_BIN", target / "debug" / "verdict"))
    if not binary.is_file():
        pytest.fail(f"no verdict binary at {binary}: run `cargo build -p verdict` (or set VERDICT_BIN)")
    return binary


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass
class Tenant:
    id: str
    api_key: str
    signing_secret: str
    webhook_secret: str


@dataclass
class Verdict:
    """A running `verdict serve` and the one tenant it was started with."""

    base: str
    tenant: Tenant
    env: dict[str, str]
    process: subprocess.Popen[str]

    def get(self, path: str) -> Any:
        response = httpx.get(f"{self.base}{path}", headers={"Authorization": f"Bearer {self.tenant.api_key}"})
        response.raise_for_status()
        return response.json()

    def post(self, path: str) -> httpx.Response:
        return httpx.post(f"{self.base}{path}", headers={"Authorization": f"Bearer {self.tenant.api_key}"})


def start_verdict(tmp: Path, callback_url: str) -> Verdict:
    binary = str(verdict_binary())
    env = {
        **os.environ,
        "VERDICT_DATABASE_URL": f"sqlite://{tmp}/verdict.db",
        # The receiver is on this machine; private destinations are refused by default.
        "VERDICT_ALLOW_PRIVATE_DESTINATIONS": "1",
        "VERDICT_LOG": "warn",
    }
    created = subprocess.run(
        [binary, "tenant", "create", "--name", "sdk-test", "--callback-url", callback_url, "--json"],
        env=env, check=True, capture_output=True, text=True,
    )
    tenant_json = json.loads(created.stdout)
    tenant = Tenant(tenant_json["tenant_id"], tenant_json["api_key"], tenant_json["signing_secret"],
                    tenant_json["webhook_secret"])
    port = free_port()
    process = subprocess.Popen(
        [binary, "serve", "--listen", f"127.0.0.1:{port}"], env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"verdict serve exited with {process.returncode}")
        try:
            if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                return Verdict(base, tenant, env, process)
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    process.kill()
    pytest.fail("verdict serve did not become ready in 30 s")


@dataclass
class Handled:
    """What the test's handler saw: one entry per call."""

    deliveries: list[Delivery] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, delivery: Delivery) -> None:
        with self.lock:
            self.deliveries.append(delivery)

    def of_event(self, event_id: str) -> list[Delivery]:
        with self.lock:
            return [d for d in self.deliveries if d.envelope.event_id == event_id]

    def wait_for(self, event_id: str, timeout: float = 10.0) -> list[Delivery]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if found := self.of_event(event_id):
                return found
            time.sleep(0.05)
        raise AssertionError(f"no callback for event {event_id} within {timeout} s")


@dataclass
class Stack:
    """verdict, and the SDK's receiver it calls back, with the handler's record."""

    verdict: Verdict
    receiver_url: str
    handled: Handled
    framework: str


class _Server(threading.Thread):
    """A WSGI or ASGI app on 127.0.0.1 in a daemon thread, stopped by `stop()`."""

    def __init__(self, serve: Callable[[], None], stop: Callable[[], None]) -> None:
        super().__init__(daemon=True)
        self._serve, self.stop = serve, stop

    def run(self) -> None:
        self._serve()


def serve_fastapi(receiver: Receiver, handled: Handled, port: int) -> _Server:
    app = FastAPI()
    app.add_api_route("/verdict", fastapi_endpoint(receiver, handled), methods=["POST"])
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = _Server(server.run, lambda: setattr(server, "should_exit", True))
    thread.start()
    return thread


def serve_flask(receiver: Receiver, handled: Handled, port: int) -> _Server:
    app = Flask("verdict-sdk-test")
    app.add_url_rule("/verdict", view_func=flask_view(receiver, handled), methods=["POST"])
    server = make_server("127.0.0.1", port, app, threaded=True)
    thread = _Server(server.serve_forever, server.shutdown)
    thread.start()
    return thread


def wait_listening(port: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    pytest.fail(f"the receiver did not listen on {port}")


@pytest.fixture(scope="module", params=["fastapi", "flask"])
def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """verdict calling back the SDK's receiver, mounted in FastAPI or in Flask."""
    tmp = tmp_path_factory.mktemp(f"verdict-{request.param}")
    port = free_port()
    receiver_url = f"http://127.0.0.1:{port}/verdict"
    # The tenant (and its webhook secret) exists before the receiver that checks it.
    verdict = start_verdict(tmp, receiver_url)
    handled = Handled()
    receiver = Receiver(verdict.tenant.webhook_secret, SqliteDedupStore(tmp / "received.db"))
    serve = serve_fastapi if request.param == "fastapi" else serve_flask
    server = serve(receiver, handled, port)
    wait_listening(port)
    try:
        yield Stack(verdict, receiver_url, handled, request.param)
    finally:
        verdict.process.terminate()
        verdict.process.wait(timeout=10)
        server.stop()
        server.join(timeout=10)
