"""naiad's web console at `/` on the HTTP port: the models and their state, live charts from
the server's own counters, a form to try a model and a chat playground for LLMs.

A static page (package data in `static/`, no build step, no CDN) that calls the server's public
APIs with the user's credentials, plus a few endpoints of its own (endpoints.py). `--console=false`
turns it off.
"""
