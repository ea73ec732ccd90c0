"""Frontends: the protocols (HTTP/1.1 and KServe V2 with Triton's extensions, gRPC over naiad's
HTTP/2 wire, the OpenAI API, the web console). They decode, call `core.server.InferenceServer`
and encode; each connection owns its buffers and flow-control state, bounded per connection
(`connections`), and nothing in a frontend outlives its connection but what the core keeps.
"""
