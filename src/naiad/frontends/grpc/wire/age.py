"""Maximum connection age (--grpc-max-connection-age-ms / -grace-ms), as gRPC core's
GRPC_ARG_MAX_CONNECTION_AGE_MS and GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS.

A gRPC channel keeps one HTTP/2 connection for as long as it lives, so behind a TCP load
balancer every call of a long-lived client goes to the replica it first reached (Triton
server#6177, client#820). Ending connections at an age makes clients reconnect, and each
reconnection may land on another replica.
"""

from __future__ import annotations

import random

from naiad.config.options import GrpcOptions

# gRPC core spreads the age by +-10 % so connections opened together do not all end together.
JITTER = 0.1
# The first GOAWAY names the highest possible stream (RFC 9113 §6.8): calls the client sent
# before it saw the GOAWAY are still served; the second names the last stream really opened.
MAX_STREAM_ID = 2**31 - 1
# When the client does not answer the PING between the two GOAWAYs, send the second after this.
PING_WAIT_S = 1.0


def age_seconds(options: GrpcOptions, rng: random.Random | None = None) -> float:
    """This connection's age limit in seconds, jittered; 0 when there is none."""
    if options.max_connection_age_ms <= 0:
        return 0.0
    factor = 1 + (rng or random).uniform(-JITTER, JITTER)
    return options.max_connection_age_ms / 1000 * factor


def grace_seconds(options: GrpcOptions) -> float:
    """How long calls still open at the age get before the connection closes; 0: no limit."""
    return max(options.max_connection_age_grace_ms, 0) / 1000
