"""TLS for the gRPC listener from --grpc-use-ssl[-mutual], --grpc-server-cert/-key and
--grpc-root-cert: as grpcio credentials or as an ssl.SSLContext for naiad's own transport."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc

from naiad.config.options import GrpcOptions
from naiad.errors import Unavailable


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """The PEM files TLS needs, read once (so a missing file fails the start clearly)."""

    key: bytes
    cert: bytes
    root: bytes | None
    mutual: bool
    key_path: str
    cert_path: str


def tls_files(options: GrpcOptions) -> TlsFiles | None:
    """None for plain text; Unavailable when a file cannot be read or mutual TLS has no root."""
    if not options.use_ssl:
        return None
    key = _read("--grpc-server-key", options.server_key)
    cert = _read("--grpc-server-cert", options.server_cert)
    root = _read("--grpc-root-cert", options.root_cert) if options.root_cert else None
    if options.use_ssl_mutual and root is None:
        raise Unavailable("--grpc-use-ssl-mutual needs --grpc-root-cert to verify client certificates")
    return TlsFiles(key, cert, root, options.use_ssl_mutual, options.server_key, options.server_cert)


def grpcio_credentials(files: TlsFiles) -> grpc.ServerCredentials:
    return grpc.ssl_server_credentials([(files.key, files.cert)], root_certificates=files.root,
                                       require_client_auth=files.mutual)


def ssl_context(files: TlsFiles) -> ssl.SSLContext:
    """A server context offering HTTP/2 by ALPN (gRPC clients require it); mutual: client
    certificates must be signed by the root certificate."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["h2"])
    try:
        context.load_cert_chain(files.cert_path, files.key_path)
        if files.root is not None:
            context.load_verify_locations(cadata=files.root.decode("ascii", "replace"))
    except (ssl.SSLError, ValueError) as error:
        raise Unavailable(f"failed to load the gRPC TLS certificates: {error}") from None
    if files.mutual:
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def _read(flag: str, path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as error:
        raise Unavailable(f"failed to read {flag} '{path}': {error.strerror or error}") from None
