"""Client tools: `naiad bench` (load generation, perf_analyzer / genai-perf figures) and `naiad tune`
(a config search under a latency or throughput objective).

They talk to a server only through its public APIs (KServe V2 over HTTP or gRPC, the statistics
and repository extensions, the OpenAI API), so they measure Triton as well as naiad. They never
import the server's core (an import-linter contract); `naiad.tools.inprocess` is the one module
that does, to drive a server in this process without a network.
"""
