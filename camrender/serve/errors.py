"""The errors `camrender serve` answers: an HTTP status and a JSON body in OpenAI's shape, naming the field.

    {"error": {"message": "num_frames: full mode renders at most 8185 frames, got 100000",
               "type": "invalid_request_error", "param": "num_frames", "code": "invalid_value"}}
"""
from __future__ import annotations

from typing import Optional

TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
         405: "invalid_request_error", 409: "conflict_error", 413: "request_too_large", 415: "invalid_request_error",
         422: "render_error", 429: "rate_limit_error", 503: "server_error"}


class ServeError(Exception):
    """A request the server refuses: `status` (4xx; 503 while it stops), one-line `message`, the request field
    `param` it is about (None: the request as a whole), a machine-readable `code` and the answer's `headers`
    (`Retry-After`, `WWW-Authenticate`)."""

    def __init__(self, status: int, message: str, param: Optional[str] = None, code: str = "invalid_value",
                 headers: Optional[dict] = None):
        self.status, self.param, self.code, self.headers = status, param, code, dict(headers or {})
        named = param is None or message.startswith(f"{param}:")
        self.message = " ".join((message if named else f"{param}: {message}").split())
        super().__init__(self.message)

    def body(self) -> dict:
        return error_body(self.status, self.message, self.param, self.code)


def error_body(status: int, message: str, param: Optional[str] = None, code: Optional[str] = None) -> dict:
    """The JSON of an error answer."""
    return {"error": {"message": " ".join(str(message).split()), "type": TYPES.get(status, "server_error"),
                      "param": param, "code": code or str(status)}}
