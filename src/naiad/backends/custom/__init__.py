"""The "custom" backend: a model's own shared library implementing naiad_backend.h (a small C
ABI), run in a process per instance by the Python backend's machinery (docs/custom_backend.md)."""
