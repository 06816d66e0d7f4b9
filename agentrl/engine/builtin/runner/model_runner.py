"""Inference stage, device side: the served model's forward passes over the engine's slot storage.

The scheduler decides which rows a pass computes; this module decides how it runs. On CUDA,
Llama-like models (`model_setup.FUSED_FAMILIES`) go through the engine's own fused forward
(`fused_decoder`); any other model, and every model on CPU, through transformers' modules with attention routed to the slots
(`slot_attention`). A decode step takes its inputs as one staged block (`decode_batch`), gathers
its input ids on the device from the previous step's samples, and samples its own tokens; on
CUDA it replays as a captured graph (`decode_graphs`), and so do the fused forward's prefill
passes of up to a couple of thousand tokens (`prefill_graphs`).
"""

from __future__ import annotations

import dataclasses
import inspect
import warnings

import torch
from transformers import PreTrainedModel

from agentrl.compiled_layers import compile_decoder_layers
from agentrl.engine.builtin.cache.slot_cache import SlotForward, SlotKVCache, causal_slot_mask
from agentrl.engine.builtin.model.model_setup import attention_backends, fused_forward_unsupported, slot_shape
from agentrl.engine.builtin.model.slot_attention import install_slot_attention
from agentrl.engine.builtin.runner.decode_batch import DecodeBatch, DecodeInputs
from agentrl.engine.builtin.runner.decode_fields import PICK_ENTRY, SAMPLING
from agentrl.engine.builtin.runner.decode_graphs import DecodeGraphs
from agentrl.engine.builtin.runner.packed_prefill import PackedPrefill
from agentrl.engine.builtin.runner.prefill_graphs import PrefillGraphs
from agentrl.engine.builtin.runner.sampling import RowSampling, sample_picked
from agentrl.engine.builtin.runner.step_inputs import PrefillRows, StepInputs, decode_inputs, prefill_inputs
from agentrl.engine.protocol import SamplingParams


class ModelRunner:
    """Forward passes of `model` (already on `device`) over `max_batch_size` slots of keys/values.

    Flags as in `TransformersEngine`. Build it before listing the model's parameters: the fused
    forward turns the q/k/v and gate/up parameters into views of packed matrices.
    `decode_lookahead`: decode steps the scheduler launches before reading one; the staged
    blocks and pick buffer entries that steps take in turn are sized for it.
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
        decode_lookahead: int,
    ) -> None:
        self.model = model
        self.device = device
        self.vocab_size = model.get_input_embeddings().num_embeddings  # token ids a pass can embed
        self._cache_keyword = cache_keyword(model)
        install_slot_attention(model)
        self.fused_decoder = None
        if fused_forward and device.type == "cuda" and fused_forward_unsupported(model) is None:
            from agentrl.engine.builtin.model.fused_decoder import FusedDecoder  # Triton: CUDA machines only

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
        # Sampled tokens, kept on the device as the next decode step's input ids: a decode step
        # writes entries 0.. (by row), a prefill pass entries max_batch_size + slot.
        self.max_batch_size = max_batch_size
        self.samples = torch.zeros(2 * max_batch_size, dtype=torch.long, device=device)
        # Where a decode step's sampler writes its picks on CUDA (`decode_batch`), and the entry the
        # next step takes. Steps take every entry but the last in turn, and graph captures write the
        # last: an entry is written again decode_lookahead + 1 steps later, once its step was read.
        self.pick_buffer = None
        self._next_pick_entry = 0
        self._step_pick_entries = decode_lookahead + 1
        if device.type == "cuda":
            self.pick_buffer = torch.zeros(
                (self._step_pick_entries + 1, 2, max_batch_size), dtype=torch.float64, pin_memory=True
            )
        self.decode_graphs = None
        self.prefill_graphs = None
        if cuda_graphs and device.type == "cuda":
            # The fused decode attention reads each row's own keys: its graphs need no length buckets.
            length_step = None if self.fused_decoder is not None else 256
            self.decode_graphs = DecodeGraphs(self._graph_step, max_rows=max_batch_size, device=device,
                                              length_step=length_step, carried=self.samples,
                                              capture_pick_entry=self._step_pick_entries,
                                              num_blocks=decode_lookahead + 1)  # fmt: skip
            if self.fused_decoder is not None:
                self.prefill_graphs = PrefillGraphs(
                    self._fused_prefill, max_rows=max_batch_size, device=device
                )

    @property
    def packed_prefill(self) -> bool:
        """Whether a prefill pass computes only real tokens (the fused forward drops left padding)."""
        return self.fused_decoder is not None

    def drop_graphs(self) -> None:
        """Free the captured graphs for good (the runner replays none after).

        They call back into the runner, so runner and graphs form a reference cycle: left to
        Python's cycle collector, which may not run for a long time, the slot storage they keep
        alive (gigabytes at a large batch) would outlive the engine.
        """
        self.decode_graphs = self.prefill_graphs = None

    def grow_slots(self, num_positions: int) -> None:
        """Make every slot hold at least `num_positions` positions."""
        if self.slots.ensure_capacity(num_positions):  # graphs read the storage that was just replaced
            if self.decode_graphs is not None:
                self.decode_graphs.clear()  # captured again by the next step, on its inputs
            if self.prefill_graphs is not None:
                self.prefill_graphs.clear()
                self.prefill_graphs.capture_all()  # now, so that no prefill pass waits for a capture

    def stage_decode(
        self,
        positions: list[int],
        sources: list[int],
        host_ids: list[int],
        params: list[SamplingParams],
        uniforms: list[float],
        shares: tuple[list[int], list[int]] | None = None,
    ) -> DecodeBatch:
        """A decode step's inputs for slots 0..len(positions)-1, staged as `DecodeBatch.stage` says."""
        columns = len(positions) if self.decode_graphs is None else self.decode_graphs.columns(len(positions))
        pick_entry = self._next_pick_entry
        self._next_pick_entry = (pick_entry + 1) % self._step_pick_entries
        return DecodeBatch.stage(positions, sources, host_ids, params, uniforms, shares, columns=columns,
                                 pin=self.device.type == "cuda", pick_entry=pick_entry)  # fmt: skip

    def decode(self, batch: DecodeBatch) -> torch.Tensor:
        """One new token for each of the batch's rows, sampled: [2, rows] float64 (token id, logprob).

        On the device, or, on CUDA for rows without top-k/top-p, in the host's pick buffer, which
        holds them once the step is done (`PendingStep.launch`).
        """
        num_rows = batch.num_rows
        if self.decode_graphs is None:
            block = batch.staged.to(self.device, non_blocking=True)
            _, picked = self._decode_step(block, batch.params, batch.max_position + 1, batch.shares)
        else:
            logits, picked = self.decode_graphs.run(batch, self.slots.capacity)
            if batch.filters:  # the graph sampled by temperature alone: sample these rows again
                staged = batch.staged[SAMPLING:PICK_ENTRY, :num_rows].to(self.device, non_blocking=True)
                sampling = RowSampling.from_staged(staged, batch.params)
                return sample_picked(logits[:num_rows], sampling, self.samples[:num_rows])
        if picked is None:
            return self.pick_buffer[batch.pick_entry, :, :num_rows]
        return picked[:, :num_rows]

    def prefill(self, rows: PrefillRows) -> torch.Tensor:
        """Logits [rows, vocab] of each row's last prompt token."""
        if self.fused_decoder is None:
            return self._module_forward(prefill_inputs(rows).to(self.device), rows.first_slot)
        packed = PackedPrefill.of(rows)
        if self.prefill_graphs is not None and self.prefill_graphs.serves(packed):
            return self.prefill_graphs.run(packed)
        return self._fused_prefill(packed.aligned().to(self.device))

    def sample_prefill(
        self, logits: torch.Tensor, sampling: RowSampling, first_slot: int
    ) -> tuple[torch.Tensor, int]:
        """(picked [2, rows], first sample entry) of a prefill pass's logits, its samples kept for the next decode step."""
        first_sample = self.max_batch_size + first_slot
        picked = sample_picked(logits, sampling, self.samples[first_sample : first_sample + logits.shape[0]])
        return picked, first_sample

    def _fused_prefill(self, packed: PackedPrefill) -> torch.Tensor:
        with attention_backends(self.device):
            return self.fused_decoder.prefill(packed, self.slots)

    def _forward_decode(self, inputs: StepInputs) -> torch.Tensor:
        """Logits [rows, vocab] of a decode step over slots 0..rows-1."""
        if self.fused_decoder is not None:
            with attention_backends(self.device):
                return self.fused_decoder.decode(inputs, self.slots)
        return self._module_forward(inputs, first_slot=0)

    def _module_forward(self, inputs: StepInputs, first_slot: int) -> torch.Tensor:
        """Logits [rows, vocab] of each row's last position, through transformers' modules."""
        plan = SlotForward(
            storage=self.slots, first_slot=first_slot, num_rows=inputs.input_ids.shape[0],
            key_length=inputs.key_length, write_slots=inputs.write_slots,
            write_positions=inputs.write_positions, write_index=inputs.write_index,
        )  # fmt: skip
        with attention_backends(self.device):
            output = self.model(
                input_ids=inputs.input_ids, position_ids=inputs.positions,
                attention_mask=causal_slot_mask(inputs.positions, inputs.key_length),
                use_cache=True, logits_to_keep=1, slot_forward=plan, **{self._cache_keyword: plan},
            )  # fmt: skip
        return output.logits[:, -1, :]

    def _decode_step(
        self,
        block: torch.Tensor,
        params: list[SamplingParams],
        key_length: int,
        shares: bool,
        temperature_only: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(logits [columns, vocab], picked [2, columns]) of a decode step over slots 0..columns-1;
        picked is None where the sampler wrote the picks into the pick buffer's entry the block names.
        `shares`: whether some row reads its first keys from another row's slot (`prefix_sharing`).

        Reads the previous step's samples for rows that continue one, and leaves its own in their place.
        """
        inputs = DecodeInputs.unpack(block, params, self.samples)
        shared = (inputs.share_rows, inputs.share_lengths) if shares else None
        logits = self._forward_decode(
            decode_inputs(inputs.input_ids, inputs.positions, key_length, inputs.slots, shared)
        )
        sampling = inputs.sampling
        if temperature_only:
            sampling = dataclasses.replace(sampling, all_greedy=False, max_top_k=-1, any_top_p=False)
        pick_buffer = None if self.pick_buffer is None else (self.pick_buffer, inputs.pick_entries)
        return logits, sample_picked(logits, sampling, self.samples[: logits.shape[0]], pick_buffer)

    def _graph_step(
        self, block: torch.Tensor, key_length: int, shares: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The body of a decode graph: its sampler is the temperature-only one, whatever the rows ask."""
        return self._decode_step(block, [], key_length, shares, temperature_only=True)


def cache_keyword(model: PreTrainedModel) -> str:
    """The keyword `model.forward` takes its key/value cache by: `cache` from transformers 5.24, else `past_key_values`.

    Passed by the wrong name, the cache would travel on as an unused keyword and the model would
    build a cache of its own, leaving the slots unwritten.
    """
    parameters = inspect.signature(type(model).forward).parameters
    for keyword in ("cache", "past_key_values"):
        if keyword in parameters:
            return keyword
    raise ValueError(
        f"{type(model).__name__}.forward takes neither `cache` nor `past_key_values`, so the engine cannot "
        "hand it its key/value slots; serve it with engine.backend=sglang"
    )
