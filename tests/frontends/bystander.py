"""A well-behaved client, run in its own process beside an attack (so that the attacker's Python
does not slow it down through the test process's GIL): it infers on a small identity model in a
loop and prints one line per request, `<start monotonic s> <latency s> <1 ok | 0 failed>`.

    python tests/frontends/bystander.py grpc|http HOST:PORT MODEL [TOKEN]

It runs until it is killed. A request that fails (connection refused, reset, timed out) counts
with its latency and the client is made anew.
"""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Any

import numpy as np

TIMEOUT_S = 5.0
PAUSE_S = 0.01


def _client(protocol: str, url: str) -> Any:
    if protocol == "grpc":
        import tritonclient.grpc as grpcclient

        return grpcclient, grpcclient.InferenceServerClient(url)
    import tritonclient.http as httpclient

    return httpclient, httpclient.InferenceServerClient(url, connection_timeout=TIMEOUT_S, network_timeout=TIMEOUT_S)


def main() -> None:
    protocol, url, model = sys.argv[1:4]
    token = sys.argv[4] if len(sys.argv) > 4 else ""
    headers = {"authorization": f"Bearer {token}"} if token else None
    data = np.arange(4, dtype=np.float32)
    module, client = _client(protocol, url)
    while True:
        started = time.monotonic()
        ok = 1
        try:
            tensor = module.InferInput("INPUT0", [4], "FP32")
            tensor.set_data_from_numpy(data)
            if protocol == "grpc":
                result = client.infer(model, [tensor], headers=headers, client_timeout=TIMEOUT_S)
            else:
                result = client.infer(model, [tensor], headers=headers)
            if not np.array_equal(result.as_numpy("OUTPUT0"), data):
                ok = 0
        except Exception:
            ok = 0
        print(f"{started:.6f} {time.monotonic() - started:.6f} {ok}", flush=True)
        if not ok:
            with contextlib.suppress(Exception):
                client.close()
            module, client = _client(protocol, url)
        time.sleep(PAUSE_S)


if __name__ == "__main__":
    main()
