"""Plain HTTP for what tritonclient cannot express: exact headers and bodies, every status."""

from __future__ import annotations

import json
from http.client import HTTPConnection
from typing import Any


class Answer:
    """One HTTP response: status, lower-cased headers, body."""

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)

    def error(self) -> str:
        """The message of a Triton error body (asserting its shape)."""
        assert self.headers.get("content-type") == "application/json", self.headers
        document = self.json()
        assert list(document) == ["error"], document
        return str(document["error"])


def http(url: str, path: str, method: str = "GET", body: bytes | None = None,
         headers: dict[str, str] | None = None, timeout: float = 10.0) -> Answer:
    """One request to `url` ("host:port") sending exactly `headers` (plus Content-Length for a body)."""
    host, port = url.rsplit(":", 1)
    connection = HTTPConnection(host, int(port), timeout=timeout)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return Answer(response.status, {k.lower(): v for k, v in response.getheaders()}, response.read())
    finally:
        connection.close()


def post(url: str, path: str, body: bytes, headers: dict[str, str] | None = None, timeout: float = 10.0) -> Answer:
    return http(url, path, "POST", body, headers, timeout)


def post_json(url: str, path: str, document: Any) -> Answer:
    return http(url, path, "POST", json.dumps(document).encode(), {"Content-Type": "application/json"})
