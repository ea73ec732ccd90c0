"""Adapters that run naiad inside other serving systems; each imports its system only when used
(Ray is an optional extra: `pip install naiad[ray]`)."""
