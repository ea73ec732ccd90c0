"""The console's static files: all there in the package, self-contained (no CDN, works
offline), served gzipped with an ETag and revalidated with a 304."""

from __future__ import annotations

import asyncio
import gzip
import re
from typing import cast

from naiad.core.server import InferenceServer
from naiad.frontends.console.assets import PAGE, assets
from naiad.frontends.console.endpoints import asset, page
from naiad.frontends.http.routes import Route

_SERVER = cast(InferenceServer, None)


def test_every_file_the_page_names_is_served() -> None:
    files = assets()
    html = files[PAGE].body.decode()
    named = set(re.findall(r'(?:href|src)="/console/([^"]+)"', html))
    for name, found in files.items():
        if name.endswith(".js"):
            named |= set(re.findall(r'from "\./([^"]+)"', found.body.decode()))
    assert named and named <= set(files), named - set(files)
    assert {"app.js", "charts.js", "console.css"} <= named


def test_nothing_is_fetched_from_elsewhere() -> None:
    for name, found in assets().items():
        text = found.body.decode()
        assert not re.search(r"""(?:src|href|from|import)\s*=?\s*["'](?:https?:)?//""", text), name
        assert "fetch(\"http" not in text and "cdn" not in text.lower(), name


def test_gzip_etag_and_revalidation() -> None:
    reply = asyncio.run(page(_SERVER, Route("console_page"), b"", {b"accept-encoding": b"gzip, br"}))
    assert reply.status == 200 and reply.content_type.startswith(b"text/html")
    headers = dict(reply.headers)
    assert headers[b"content-encoding"] == b"gzip" and headers[b"cache-control"] == b"no-cache"
    assert gzip.decompress(reply.body) == assets()[PAGE].body
    again = asyncio.run(page(_SERVER, Route("console_page"), b"", {b"if-none-match": headers[b"etag"]}))
    assert again.status == 304 and again.body == b""
    plain = asyncio.run(asset(_SERVER, Route("console_asset", asset="app.js"), b"", {}))
    assert plain.status == 200 and plain.body == assets()["app.js"].body
    assert plain.content_type.startswith(b"text/javascript")
    missing = asyncio.run(asset(_SERVER, Route("console_asset", asset="nope.js"), b"", {}))
    assert missing.status == 404


def test_the_whole_console_is_small() -> None:
    """A light page: everything it loads, gzipped, under 40 KB."""
    assert sum(len(found.gzipped) for found in assets().values()) < 40_000
