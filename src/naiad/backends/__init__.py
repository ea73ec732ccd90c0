"""Backends: backend → model → instance, as in Triton.

`base` documents the one instance contract (`ModelInstance.submit(batch, sender) -> bool` with a
room callback); `threaded.ThreadedInstance` implements it on a thread for frameworks whose
`execute(batch)` blocks. Each instance owns its framework session and, for the Python backend,
its model process; `registry` maps backend names to implementations, imported lazily.
"""
