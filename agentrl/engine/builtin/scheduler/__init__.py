"""Inference stage, the built-in engine's scheduler: the thread that alone touches the model.

In one `generate()` call: the caller's `Request` (`request.py`) reaches `Scheduler` (`scheduler.py`)
through the engine's inbox; `admission.py` picks it for a prefill pass; each iteration launches a
decode step for every running row, reads the tokens of passes launched earlier (`pending_step.py`),
and answers a finished request through its future. `prefix_sharing.py` tracks which running rows
hold the same cached blocks, so decode reads them from one slot; `records.py` holds the counters,
the per-pass records and the queued weight updates. Below it: `runner/` and `cache/`.
"""
