"""Inference stage, the built-in engine's model runner: how one pass runs on the device.

In one `generate()` call the scheduler asks `ModelRunner` (`model_runner.py`) for a prefill pass
over the request's prompt, then for a decode step per token. A pass's inputs are built here and
read by the model and kernels below: a prefill pass's rows (`step_inputs.py`), packed for the fused
forward (`packed_prefill.py`); a decode step's staged block (`decode_batch.py`, its layout in
`decode_fields.py`). On CUDA, decode steps and small prefill passes replay captured graphs
(`decode_graphs.py`, `prefill_graphs.py`). `sampling.py` turns each pass's logits into tokens and
logprobs, per row. Above it: `scheduler/`; below it: `model/`, `kernels/`, `cache/`.
"""
