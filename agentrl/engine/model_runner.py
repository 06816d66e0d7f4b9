"""Inference stage, device side: the served model's forward passes over the engine's slot storage.

The scheduler decides which rows a pass computes; this module decides how it runs. On CUDA,
Llama and Qwen2 models go through the engine's own fused forward (`fused_decoder`); any other
model, and every model on CPU, through transformers' modules with attention routed to the slots
(`slot_attention`). Decode steps replay captured CUDA graphs where they exist (`decode_graphs`).
"""

from __future__ import annotations

import warnings

import torch
from transformers import PreTrainedModel

from agentrl.compiled_layers import compile_decoder_layers
from agentrl.engine.decode_graphs import DecodeGraphs
from agentrl.engine.model_setup import attention_backends, fused_forward_unsupported, slot_shape
from agentrl.engine.slot_attention import install_slot_attention
from agentrl.engine.slot_cache import SlotForward, SlotKVCache, causal_slot_mask
from agentrl.engine.step_inputs import StepInputs, decode_inputs


class ModelRunner:
    """Forward passes of `model` (already on `device`) over `max_batch_size` slots of keys/values.

    Flags as in `TransformersEngine`. Build it before listing the model's parameters: the fused
    forward turns the q/k/v and gate/up parameters into views of packed matrices.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        *,
        device: torch.device,
        max_batch_size: int,
        max_context_len: int,
        cuda_graphs: bool,
        torch_compile: bool,
        fused_forward: bool,
    ) -> None:
        self.model = model
        self.device = device
        install_slot_attention(model)
        self.fused_decoder = None
        if fused_forward and device.type == "cuda" and fused_forward_unsupported(model) is None:
            from agentrl.engine.fused_decoder import FusedDecoder  # Triton: CUDA machines only

            self.fused_decoder = FusedDecoder(model)
            if torch_compile:
                warnings.warn(
                    "torch_compile has no effect here: the fused forward runs this model on CUDA and no "
                    "transformers module is left to compile (fused_forward=False compiles them instead)",
                    stacklevel=3,  # the engine's caller
                )
        elif torch_compile:
            compile_decoder_layers(model)
        self.slots = SlotKVCache(**slot_shape(model), num_slots=max_batch_size, max_capacity=max_context_len,
                                 dtype=next(model.parameters()).dtype, device=device)  # fmt: skip
        self.decode_graphs = None
        if cuda_graphs and device.type == "cuda":
            self.decode_graphs = DecodeGraphs(self._decode_forward, max_rows=max_batch_size, device=device,
                                              length_step=256)  # fmt: skip

    def grow_slots(self, num_positions: int) -> None:
        """Make every slot hold at least `num_positions` positions."""
        if self.slots.ensure_capacity(num_positions) and self.decode_graphs is not None:
            self.decode_graphs.clear()  # the graphs read the storage that was just replaced

    def decode(self, input_ids: torch.Tensor, positions: list[int]) -> torch.Tensor:
        """Logits [rows, vocab] of one new token for each of slots 0..rows-1 (`input_ids` on the device)."""
        if self.decode_graphs is not None:
            return self.decode_graphs.run(input_ids, positions, self.slots.capacity)
        return self.forward(decode_inputs(input_ids, positions), first_slot=0)

    def forward(self, inputs: StepInputs, first_slot: int) -> torch.Tensor:
        """Logits of each row's last position: [num_rows, vocab]."""
        if self.fused_decoder is not None:
            with attention_backends(self.device):
                return self.fused_decoder.forward(inputs, first_slot, self.slots)
        plan = SlotForward(
            storage=self.slots, first_slot=first_slot, num_rows=inputs.input_ids.shape[0],
            key_length=inputs.key_length, write_slots=inputs.write_slots,
            write_positions=inputs.write_positions, write_index=inputs.write_index,
        )  # fmt: skip
        with attention_backends(self.device):
            output = self.model(
                input_ids=inputs.input_ids, position_ids=inputs.positions,
                attention_mask=causal_slot_mask(inputs.positions, inputs.key_length),
                past_key_values=plan, use_cache=True, logits_to_keep=1, slot_forward=plan,
            )  # fmt: skip
        return output.logits[:, -1, :]

    def _decode_forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, key_length: int
    ) -> torch.Tensor:
        """A decode step over slots 0..rows-1 on static device tensors (the body of a CUDA graph)."""
        num_rows = input_ids.shape[0]
        slots = torch.arange(num_rows, device=self.device)
        inputs = StepInputs(input_ids, positions, slots, positions[:, 0], None, key_length)
        return self.forward(inputs, first_slot=0)
