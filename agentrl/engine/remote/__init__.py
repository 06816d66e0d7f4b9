"""Inference stage, remote: an engine that generates through an SGLang-protocol server over HTTP.

`sglang_client.py` (`SGLangEngine`) speaks the subset of SGLang's native protocol in
`sglang_protocol.py` to SGLang itself or to `python -m agentrl.engine.serve`; `sglang_launcher.py`
starts a server for `engine.launch=true` or checks one to attach to; `balanced_client.py`
(`BalancedEngine`) spreads episodes over several servers. `factory.build_engine` builds them.
"""
