"""HTTPS for the HTTP listener: naiad's own --http-ssl-cert / --http-ssl-key (tritonserver has
no HTTPS flag; it expects a proxy in front), as an ssl.SSLContext for the asyncio server."""

from __future__ import annotations

import ssl

from naiad.errors import Unavailable


def http_ssl_context(cert: str, key: str) -> ssl.SSLContext | None:
    """None for plain HTTP (neither file given); Unavailable when only one is given or the
    files cannot be loaded, so the server fails at start with the reason."""
    if not cert and not key:
        return None
    if not cert or not key:
        raise Unavailable("HTTPS needs both --http-ssl-cert and --http-ssl-key")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["http/1.1"])
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError, ValueError) as error:
        raise Unavailable(f"failed to load the HTTPS certificate '{cert}' and key '{key}': {error}") from None
    return context
