"""The receiver as a FastAPI (Starlette) endpoint:

    app.add_api_route("/verdict", fastapi_endpoint(receiver, handle), methods=["POST"])
"""

from __future__ import annotations

from typing import Awaitable, Callable

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from .receiver import Handler, Receiver


def fastapi_endpoint(receiver: Receiver, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    """An endpoint that reads the raw body, then verifies, deduplicates and handles it."""

    async def verdict_callback(request: Request) -> Response:
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > receiver.max_body_bytes:
            return Response("payload too large", status_code=413)
        body = await request.body()
        # The store and the handler block; keep them off the event loop.
        answer = await run_in_threadpool(receiver.receive, dict(request.headers), body, handler)
        return Response(answer.body, status_code=answer.status, headers=dict(answer.headers))

    return verdict_callback
