"""`naiad bench`: flags (`flags`), the sweep (`command`), LLM figures (`llm_command`), reports."""
