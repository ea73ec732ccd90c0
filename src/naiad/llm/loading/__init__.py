"""From files to a model: Hugging Face directories and GGUF files, and their tokenizers.
"""
