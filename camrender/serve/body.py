"""A `POST /v1/videos` body as {field: value}: JSON (`Content-Type: application/json`), or a form (multipart, whose
file parts become `camrender.serve.values.Upload`, the `trajectory` field's a list of them; or urlencoded). The server's body limit (aiohttp's
`client_max_size`) bounds what is read; anything else malformed is a 4xx naming what is wrong."""
from __future__ import annotations

import json

from aiohttp import web

from camrender.serve.errors import ServeError
from camrender.serve.values import Upload

FORMS = ("multipart/form-data", "application/x-www-form-urlencoded")
REPEATED = "trajectory"  # its file parts: the path, then the files its format reads beside it (cameras.txt, ...)


async def read_body(request: web.Request) -> dict:
    kind = request.content_type
    if kind == "application/json":
        return _json_object(await request.read())
    if kind not in FORMS:
        raise ServeError(415, f"send JSON (Content-Type: application/json) or a multipart form, not {kind!r}",
                         code="unsupported_media_type")
    try:
        form = await request.post()
    except web.HTTPException:  # over the body limit: 413
        raise
    except Exception as error:  # noqa: BLE001 - a malformed form: aiohttp raises ValueError, BadHttpMessage, ...
        raise ServeError(400, f"the form cannot be read ({type(error).__name__})", code="invalid_body") from None
    fields = {}
    for name, value in form.items():
        value = Upload(value.filename, value.file.read()) if isinstance(value, web.FileField) else value
        repeated = name == REPEATED and isinstance(value, Upload)  # one more file part of the path
        if name in fields and not (repeated and isinstance(fields[name], list)):
            raise ServeError(400, "given twice", param=name)
        if repeated:
            fields.setdefault(name, []).append(value)
        else:
            fields[name] = value
    return fields


def _json_object(data: bytes) -> dict:
    try:
        body = json.loads(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise ServeError(400, "the body is not valid JSON", code="invalid_json") from None
    if not isinstance(body, dict):
        raise ServeError(400, "the body must be a JSON object", code="invalid_json")
    return body
