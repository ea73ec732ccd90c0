"""Model configs as Triton's own `ModelConfig` protobuf: reading (`model_config`), auto-complete
(`autocomplete`), validation (`validate`, `sequence`) and the server's command line (`options`).
Pure functions over messages: nothing here holds state.
"""
