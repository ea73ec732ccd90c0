from naiad.frontends.http.handlers import forward_headers


def test_matching_headers_become_string_parameters():
    parameters = {"priority": 1}
    headers = {b"x-trace-id": b"abc", b"X-Tenant": b"t1", b"content-type": b"application/json"}
    forward_headers(parameters, headers, "^x-")
    assert parameters == {"priority": 1, "x-trace-id": "abc", "X-Tenant": "t1"}


def test_no_pattern_forwards_nothing():
    parameters: dict = {}
    forward_headers(parameters, {b"x-trace-id": b"abc"}, "")
    assert parameters == {}
