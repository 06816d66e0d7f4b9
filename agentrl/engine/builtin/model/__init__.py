"""Inference stage, the built-in engine's model: the forward pass a runner calls.

On CUDA, Llama-like models (Llama, Mistral, Qwen2, Qwen3) run the engine's own fused forward
(`fused_decoder.py`), nine kernels a layer from `kernels/`; any other model, and every model on
CPU, runs transformers' modules with attention routed to the slot storage (`slot_attention.py`). `model_setup.py` checks a
model before it is served and packs its parameters. In one `generate()` call, every prefill pass
and decode step goes through here. Above it: `runner/`; below it: `kernels/`, `cache/`.
"""
