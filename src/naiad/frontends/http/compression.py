"""gzip / deflate for request and response bodies (Content-Encoding / Accept-Encoding)."""

from __future__ import annotations

import gzip
import zlib

from naiad.errors import InvalidArgument


def decompress(body: bytes, encoding: str, limit: int) -> bytes:
    """Inflate a request body, refusing output past `limit` bytes (a small bomb stays small)."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding not in ("gzip", "deflate"):
        raise InvalidArgument(f"unsupported Content-Encoding '{encoding}'")
    # wbits 47 auto-detects a gzip or zlib header; 15 for zlib-wrapped deflate, -15 for raw deflate.
    for wbits in ((47,) if encoding == "gzip" else (15, -15)):
        inflater = zlib.decompressobj(wbits)
        try:
            out = inflater.decompress(body, limit + 1)
        except zlib.error:
            continue
        if len(out) > limit or inflater.unconsumed_tail:
            raise InvalidArgument(f"decompressed request body exceeds the maximum of {limit} bytes")
        if inflater.eof:  # a truncated stream inflates without error, but never reaches its end
            return out
    raise InvalidArgument(f"failed to decompress the request body with '{encoding}'")


def choose_encoding(accept_encoding: str) -> str | None:
    """The first of gzip / deflate that the client accepts, in its order of preference."""
    for part in accept_encoding.split(","):
        name, _, params = part.strip().partition(";")
        name = name.strip().lower()
        if name in ("gzip", "deflate") and params.replace(" ", "") != "q=0":
            return name
    return None


def compress(body: bytes, encoding: str) -> bytes:
    if encoding == "gzip":
        return gzip.compress(body, compresslevel=6, mtime=0)
    return zlib.compress(body, 6)
