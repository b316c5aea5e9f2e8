"""Schemathesis hooks for fuzzing verdict's API (loaded by tests/it/openapi_fuzz.rs through
SCHEMATHESIS_HOOKS).

Only what the OpenAPI document cannot say is here:
- `application/toml` bodies (PUT /v1/playbook) and `application/secevent+jwt` bodies
  (POST /v1/sets) are strings sent as UTF-8 bytes; schemathesis has no serializer of its own for
  those media types.
"""

import schemathesis


@schemathesis.serializer("application/toml", "application/secevent+jwt")
def text_serializer(ctx, value):
    if isinstance(value, bytes):
        return {"data": value}
    if isinstance(value, str):
        return {"data": value.encode("utf-8")}
    # A non-string body (negative data) goes as its JSON text, under the same label.
    import json

    return {"data": json.dumps(value).encode("utf-8")}
