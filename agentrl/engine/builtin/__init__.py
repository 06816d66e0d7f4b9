"""Inference stage, the built-in engine: a transformers causal LM behind continuous batching (CPU or one GPU).

`engine.py` (`TransformersEngine`) is what callers hold: `generate` queues a request and awaits it.
Below it, from the host to the device, each part in one named place:

- `scheduler/`: the one thread that owns the model: admits requests, runs prefill passes and
  decode steps over the running rows, reads their tokens back and answers each request;
- `runner/`: how one pass runs on the device: the inputs it stages, the CUDA graphs it replays,
  the sampler that turns logits into tokens;
- `model/`: the forward pass: the engine's fused decoder for Llama-like models on CUDA, else
  transformers' modules with attention over the slots;
- `kernels/`: the Triton kernels the fused forward launches (imported on CUDA only);
- `cache/`: keys and values: one preallocated slot per batch row, and the prefix cache that
  copies a prompt's already-seen start into a slot.
"""
