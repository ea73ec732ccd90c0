"""The engine: requests in, tokens out (LLMEngine, its core process, the step scheduler, the paged
KV block manager, sequences and their sampling parameters, the model runner and CUDA graphs).
"""
