"""gRPC messages on an HTTP/2 stream: each is a 1-byte compressed flag, a 4-byte big-endian
length and the (possibly compressed) protobuf bytes. Reassembly across DATA frames, the message
size limit, and gzip / deflate."""

from __future__ import annotations

import zlib

import grpc

Message = bytes | memoryview
_GZIP_WBITS = 16 + zlib.MAX_WBITS
ENCODINGS = {"gzip", "deflate"}
#: grpc.Compression → grpc-encoding name (None: identity).
COMPRESSION_NAMES: dict[grpc.Compression, str | None] = {
    grpc.Compression.NoCompression: None,
    grpc.Compression.Gzip: "gzip",
    grpc.Compression.Deflate: "deflate",
}


class CallError(Exception):
    """Ends a call with a gRPC status (the code's integer value) and message."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class MessageReader:
    """Splits a stream's DATA into gRPC messages, inflating compressed ones."""

    def __init__(self, max_size: int, encoding: str | None) -> None:
        self.max_size = max_size
        self.encoding = encoding
        self._chunks: list[bytes] = []
        self._have = 0
        self._need = 5  # bytes still missing for the current prefix or body
        self._compressed = False
        self._in_body = False

    @property
    def partial(self) -> bool:
        """Part of a message is buffered, waiting for the rest."""
        return self._in_body or bool(self._chunks)

    def feed(self, data: bytes) -> list[Message]:
        """The messages completed by `data` (CallError for an oversized or undecodable one)."""
        if not self._chunks and not self._in_body and len(data) >= 5:
            fast = self._whole(data)
            if fast is not None:
                return fast
        messages: list[Message] = []
        view = memoryview(data)
        while view:
            take = min(self._need, len(view))
            self._chunks.append(bytes(view[:take]))
            self._have += take
            self._need -= take
            view = view[take:]
            if self._need == 0:
                self._advance(messages)
        return messages

    def _whole(self, data: bytes) -> list[Message] | None:
        """Messages when `data` holds whole messages only (the common case): views, no copies."""
        messages: list[Message] = []
        view = memoryview(data)
        position, end = 0, len(data)
        while position < end:
            if end - position < 5:
                return None
            compressed, size = data[position], int.from_bytes(data[position + 1:position + 5], "big")
            self._check_size(size)
            if end - position - 5 < size:
                return None
            body = view[position + 5:position + 5 + size]
            messages.append(self._inflate(body) if compressed else body)
            position += 5 + size
        return messages

    def _advance(self, messages: list[Message]) -> None:
        joined = b"".join(self._chunks)
        self._chunks.clear()
        self._have = 0
        if not self._in_body:
            self._compressed = bool(joined[0])
            self._need = int.from_bytes(joined[1:5], "big")
            self._check_size(self._need)
            self._in_body = True
            if self._need:
                return
            joined = b""
        messages.append(self._inflate(joined) if self._compressed else joined)
        self._in_body = False
        self._need = 5

    def _check_size(self, size: int) -> None:
        if size > self.max_size:
            raise CallError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                            f"grpc: received message larger than max ({size} vs. {self.max_size})")

    def _inflate(self, body: Message) -> bytes:
        if self.encoding not in ENCODINGS:
            raise CallError(grpc.StatusCode.INTERNAL,
                            f"grpc: compressed message with grpc-encoding '{self.encoding or 'identity'}'")
        wbits = _GZIP_WBITS if self.encoding == "gzip" else zlib.MAX_WBITS
        inflater = zlib.decompressobj(wbits)
        try:
            plain = inflater.decompress(body, self.max_size + 1)
        except zlib.error as error:
            raise CallError(grpc.StatusCode.INTERNAL, f"grpc: failed to decompress the message: {error}") from None
        self._check_size(len(plain))
        return plain


def pack(message: bytes, encoding: str | None = None) -> list[bytes]:
    """A message as the prefix and body to send (compressed when `encoding` names gzip or deflate)."""
    if encoding is None:
        return [b"\x00" + len(message).to_bytes(4, "big"), message]
    compressor = zlib.compressobj(wbits=_GZIP_WBITS if encoding == "gzip" else zlib.MAX_WBITS)
    body = compressor.compress(message) + compressor.flush()
    return [b"\x01" + len(body).to_bytes(4, "big"), body]
