"""naiad's LLM engine: scheduler, block manager (paged KV, prefix cache), model runner, sampler.

`sequence`, `block_manager` and `scheduler` are pure Python (no torch), so `import naiad.llm`
stays light and the scheduling core is tested on the CPU with hand-made runner outputs.
"""
