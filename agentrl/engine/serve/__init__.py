"""Inference stage, served: the built-in engine behind SGLang's native HTTP protocol.

`python -m agentrl.engine.serve` (`__main__.py`) builds the engine with `build_engine` and serves
it through the routes of `http_server.py`; `remote/` holds the client that talks to it.
"""
