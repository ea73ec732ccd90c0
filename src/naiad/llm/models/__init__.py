"""Model definitions in plain torch, built from a Hugging Face config.json."""
