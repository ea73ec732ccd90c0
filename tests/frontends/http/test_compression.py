import gzip
import zlib

import pytest

from naiad.errors import InvalidArgument
from naiad.frontends.http.compression import choose_encoding, compress, decompress


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_round_trip(encoding):
    body = b'{"inputs": []}' * 100
    assert decompress(compress(body, encoding), encoding, 1 << 20) == body


def test_accepts_raw_deflate_and_identity():
    raw = zlib.compressobj(wbits=-15)
    data = raw.compress(b"hello") + raw.flush()
    assert decompress(data, "deflate", 100) == b"hello"
    assert decompress(b"plain", "identity", 100) == b"plain"


def test_refuses_a_body_that_inflates_past_the_limit():
    bomb = gzip.compress(b"\0" * 1_000_000)
    with pytest.raises(InvalidArgument, match="exceeds the maximum of 1000 bytes"):
        decompress(bomb, "gzip", 1000)


def test_refuses_garbage_and_unknown_encodings():
    with pytest.raises(InvalidArgument, match="failed to decompress"):
        decompress(b"not gzip", "gzip", 100)
    with pytest.raises(InvalidArgument, match="unsupported Content-Encoding 'br'"):
        decompress(b"x", "br", 100)


def test_choose_encoding_follows_client_order_and_q0():
    assert choose_encoding("deflate, gzip") == "deflate"
    assert choose_encoding("br, gzip;q=0.5") == "gzip"
    assert choose_encoding("gzip;q=0, identity") is None
    assert choose_encoding("") is None
