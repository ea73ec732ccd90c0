"""The load-generation core shared by `naiad bench` and `naiad tune`.

- `spec`: what a model takes, from its served config; `data`: the tensors to send.
- `http1`, `h2`: lean asyncio clients (HTTP/1.1 keep-alive, gRPC over HTTP/2) that send bodies
  encoded once (`kserve`) and only time and count the answers.
- `target`: where requests go (a server over HTTP or gRPC, or a server in this process) and its
  control calls (statistics, config, repository load).
- `load`: closed-loop concurrency and open-loop Poisson request rates over a target's slots.
- `measure`: measurement windows until stable, as perf_analyzer's, with the server-side split.
- `llm`: streaming completions for genai-perf's figures (TTFT, ITL, tokens/s).
"""
