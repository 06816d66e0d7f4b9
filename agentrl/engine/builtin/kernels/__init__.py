"""Inference stage, the built-in engine's Triton kernels: the fused forward's layers on CUDA.

Attention (`decode_attention.py`, `prefill_attention.py`, their shared step `attention_blocks.py`),
the fused layer pieces (`fused_kernels.py`: RMSNorm, rotary with the key/value store, gated MLP),
projections (`decode_linear.py`, `prefill_gate_up.py`), sampling (`fused_sampling.py`), the decode
block's unpacking (`decode_unpack.py`) and dependent launch (`dependent_launch.py`). In one
`generate()` call on CUDA, every pass of the fused forward launches these. Triton is imported only
by these modules, and they only on CUDA: nothing here is imported on a CPU machine.
"""
