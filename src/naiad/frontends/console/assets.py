"""The console's static files (package data in `static/`), read and gzipped once.

Each answer carries a strong ETag and `Cache-Control: no-cache`: the browser keeps the files
and asks again with If-None-Match, so a reload costs a 304 per file while a new naiad version
is never hidden behind a stale cache.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
from dataclasses import dataclass
from importlib import resources

_TYPES = {
    ".html": b"text/html; charset=utf-8",
    ".js": b"text/javascript; charset=utf-8",
    ".css": b"text/css; charset=utf-8",
    ".svg": b"image/svg+xml",
}
#: the page served at /
PAGE = "index.html"


@dataclass(frozen=True, slots=True)
class Asset:
    body: bytes
    gzipped: bytes
    content_type: bytes
    etag: bytes


@functools.cache
def assets() -> dict[str, Asset]:
    """Every static file by name (the folder is flat)."""
    found: dict[str, Asset] = {}
    for entry in resources.files(__package__).joinpath("static").iterdir():
        suffix = "." + entry.name.rpartition(".")[2]
        if not entry.is_file() or suffix not in _TYPES:
            continue
        body = entry.read_bytes()
        etag = b'"' + hashlib.sha256(body).hexdigest()[:20].encode() + b'"'
        found[entry.name] = Asset(body, gzip.compress(body, 9, mtime=0), _TYPES[suffix], etag)
    return found
