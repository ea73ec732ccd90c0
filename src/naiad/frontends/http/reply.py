"""What an HTTP handler answers: status, body, content type and extra headers."""

from __future__ import annotations

from typing import Any

import msgspec

from naiad.errors import NaiadError, Status

HTTP_STATUS = {
    Status.INTERNAL: 500,
    Status.NOT_FOUND: 404,
    Status.UNAVAILABLE: 503,
    Status.UNSUPPORTED: 501,
}


class Reply:
    __slots__ = ("body", "content_type", "headers", "status")

    def __init__(self, status: int = 200, body: bytes = b"", content_type: bytes = b"application/json",
                 headers: list[tuple[bytes, bytes]] | None = None) -> None:
        self.status = status
        self.body = body
        self.content_type = content_type
        self.headers = headers or []


def json_reply(value: Any, status: int = 200) -> Reply:
    return Reply(status, msgspec.json.encode(value))


def error_reply(error: NaiadError) -> Reply:
    """Triton's mapping: INTERNAL 500, NOT_FOUND 404, UNAVAILABLE 503, UNSUPPORTED 501, else 400."""
    return Reply(HTTP_STATUS.get(error.status, 400), msgspec.json.encode({"error": error.message}))
