"""Model side, shared by trainer and engine: compile decoder layers, whole or their elementwise parts.

Eager, a decoder layer's RMSNorm is a chain of elementwise passes over its activations, the
rotary embedding and the residual adds several more, and every op is a kernel launch from
Python. The trainer compiles each layer's whole forward (`compile_layer`): the elementwise work
fuses into a few kernels around the projections, and far fewer launches leave the host.
Attention functions that must not be traced (the packed trainer's per-document loop) are marked
`torch.compiler.disable` and run eagerly between two compiled graphs. The engine compiles only
the MLP and RMSNorms (`compile_elementwise_parts`): its attention goes through its own slot
storage, which the compiled graphs must never break on.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel


def compile_elementwise_parts(layer: torch.nn.Module) -> None:
    """Compile the layer's MLP and RMSNorms: eager, each is a chain of full passes over its activations.

    Attention stays eager (its kernel is already fused, and packed attention loops over
    documents). Token counts change from batch to batch, so shapes are compiled as dynamic.
    """
    parts = [getattr(layer, name, None) for name in ("mlp", "input_layernorm", "post_attention_layernorm")]
    if any(part is None for part in parts):
        raise ValueError(
            f"compiling expects decoder layers with mlp, input_layernorm and post_attention_layernorm; "
            f"{type(layer).__name__} lacks one: set actor.use_torch_compile / engine.torch_compile to false"
        )
    for part in parts:
        if not hasattr(part.forward, "_torchdynamo_orig_callable"):  # compiled once per module
            part.forward = torch.compile(part.forward, dynamic=True)


def compile_layer(layer: torch.nn.Module) -> None:
    """Compile the layer's whole forward.

    Shapes are left to dynamo's automatic dynamism: the first batch compiles static kernels,
    and the first batch with another token count recompiles with only that dimension dynamic.
    Inductor may then guard on a size threshold of the token count (4,096 on an H100), and the
    first batch on its other side compiles once more: a handful of graphs per layer in all.
    Marking every dimension dynamic up front would also make the hidden and head sizes symbolic,
    and the elementwise kernels (rotary embedding above all) much slower.
    """
    if not hasattr(layer.forward, "_torchdynamo_orig_callable"):  # compiled once per module
        layer.forward = torch.compile(layer.forward)


def decoder_layers(model: PreTrainedModel) -> list[torch.nn.Module]:
    """The modules of `model` whose class its `_no_split_modules` names (its decoder layers)."""
    layer_classes = set(getattr(model, "_no_split_modules", None) or ())
    return [module for module in model.modules() if type(module).__name__ in layer_classes]


def compile_decoder_layers(model: PreTrainedModel) -> None:
    """`compile_elementwise_parts` on every decoder layer of `model`."""
    layers = decoder_layers(model)
    if not layers:
        raise ValueError(f"{type(model).__name__} names no decoder layer class in _no_split_modules")
    for layer in layers:
        compile_elementwise_parts(layer)
