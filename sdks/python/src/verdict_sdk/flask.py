"""The receiver as a Flask view:

    app.add_url_rule("/verdict", view_func=flask_view(receiver, handle), methods=["POST"])
"""

from __future__ import annotations

from typing import Callable

from flask import Response, request

from .receiver import Handler, Receiver


def flask_view(receiver: Receiver, handler: Handler, *, name: str = "verdict_callback") -> Callable[[], Response]:
    """A view that reads the raw body, then verifies, deduplicates and handles it."""

    def verdict_callback() -> Response:
        if (request.content_length or 0) > receiver.max_body_bytes:
            return Response("payload too large", status=413)
        # The exact bytes: the signature covers them, not a re-serialised form.
        body = request.get_data(cache=False)
        answer = receiver.receive(dict(request.headers), body, handler)
        return Response(answer.body, status=answer.status, headers=dict(answer.headers))

    verdict_callback.__name__ = name
    return verdict_callback
