"""Schemathesis hooks for fuzzing verdict's API (loaded by tests/openapi_fuzz.rs through
SCHEMATHESIS_HOOKS).

Only what the OpenAPI document cannot say is here:
- `application/toml` bodies (PUT /v1/playbook) are strings sent as UTF-8 bytes; schemathesis has
  no serializer of its own for that media type.
"""

import schemathesis


@schemathesis.serializer("application/toml")
def toml_serializer(ctx, value):
    if isinstance(value, bytes):
        return {"data": value}
    if isinstance(value, str):
        return {"data": value.encode("utf-8")}
    # A non-string body (negative data) goes as its JSON text, still labelled TOML.
    import json

    return {"data": json.dumps(value).encode("utf-8")}
