"""naiad's LLM engine, in folders by role (as nano-vllm's):

- `engine/`: requests in, tokens out: `LLMEngine` (`llm_engine`), its core process, the step
  scheduler, the paged KV block manager (prefix cache), sequences and sampling parameters, the
  model runner and CUDA graphs;
- `layers/`: paged attention, the sampler, prepacked and quantized linear layers;
- `models/`: the Llama family; `loading/`: HF directories, GGUF files and tokenizers;
- `distributed/`: tensor and pipeline parallelism, worker processes, Ray actors, multi-node agents;
- `kernels/`: the C (and Triton) kernels, built on first use.

`engine.sequence`, `engine.sampling_params`, `engine.block_manager` and `engine.scheduler` are pure
Python (no torch), so `import naiad.llm` stays light and the scheduling core is tested on the
CPU with hand-made runner outputs.
"""
