"""Training stage, layout step: a micro-batch becomes model inputs, packed or padded.

A TrainBatch is [B, T], right padded. Packed, its real tokens are concatenated into one row
of N = sum of lengths tokens with position ids restarting per sequence, and attention is
confined to each sequence (agentrl.trainer.document_attention): no compute is spent on
padding. Padded, the [B, T] tensors go to the model as they are.

Either way only the scored tokens (those with loss mask 1) are turned into logprobs: token t
of sequence b is predicted by the hidden state one position earlier, and `hidden_index`
points at that state in the flattened hidden states. Results come back to [B, T] through
`scatter_scores`, so the loss sees the same tensors, and the same normalisation, in both layouts.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch


@dataclass
class ScoringInputs:
    """One forward pass's model inputs and where its N scored tokens are."""

    input_ids: torch.Tensor  # [R, L] R = 1 when packed (L = N_real), R = B when padded (L = T)
    position_ids: torch.Tensor  # [R, L]
    attention_mask: torch.Tensor | None  # [R, L] when padded; None when packed
    document_lengths: tuple[int, ...] | None  # length of each packed sequence; None when padded
    hidden_index: torch.Tensor  # [N] row of the flattened [R * L, H] hidden states predicting each token
    target_ids: torch.Tensor  # [N] the scored tokens
    rows: torch.Tensor  # [N] sequence b of each scored token in the [B, T] batch
    positions: torch.Tensor  # [N] position t of each scored token in the [B, T] batch
    batch_shape: tuple[int, int]  # (B, T)

    def to(self, device: torch.device | str) -> ScoringInputs:
        tensors = {f.name: getattr(self, f.name) for f in fields(self)}
        return replace(
            self,
            **{name: value.to(device) for name, value in tensors.items() if isinstance(value, torch.Tensor)},
        )

    def model_kwargs(self) -> dict[str, object]:
        """Keyword arguments of the transformers decoder for this layout."""
        kwargs: dict[str, object] = {"input_ids": self.input_ids, "position_ids": self.position_ids}
        if self.document_lengths is None:
            kwargs["attention_mask"] = self.attention_mask
        else:
            # A host tensor, not the tuple: compiled decoder layers see one input of dynamic size
            # and do not recompile when the number of documents changes.
            kwargs["document_lengths"] = torch.tensor(self.document_lengths)
        return kwargs


def scoring_inputs(
    input_ids: torch.Tensor,  # [B, T] right padded
    attention_mask: torch.Tensor,  # [B, T] 1 on real tokens
    position_ids: torch.Tensor,  # [B, T]
    scored_mask: torch.Tensor,  # [B, T] bool, tokens whose logprob is wanted (never position 0)
    pack: bool,
) -> ScoringInputs:
    """The model inputs of a micro-batch in the packed or padded layout (CPU tensors in, CPU out)."""
    if bool(scored_mask[:, 0].any()):
        raise ValueError("position 0 of a sequence has no predicting hidden state and cannot be scored")
    batch_size, length = input_ids.shape
    rows, positions = scored_mask.nonzero(as_tuple=True)  # row-major order
    real = attention_mask.bool()
    if pack:
        lengths = real.sum(dim=-1)  # [B]
        starts = torch.cumsum(lengths, 0) - lengths  # [B] offset of each sequence in the packed row
        return ScoringInputs(
            input_ids=input_ids[real][None],
            position_ids=position_ids[real][None],
            attention_mask=None,
            document_lengths=tuple(lengths.tolist()),
            hidden_index=starts[rows] + positions - 1,
            target_ids=input_ids[rows, positions],
            rows=rows,
            positions=positions,
            batch_shape=(batch_size, length),
        )
    return ScoringInputs(
        input_ids=input_ids,
        position_ids=position_ids,
        attention_mask=attention_mask,
        document_lengths=None,
        hidden_index=rows * length + positions - 1,
        target_ids=input_ids[rows, positions],
        rows=rows,
        positions=positions,
        batch_shape=(batch_size, length),
    )


def scatter_scores(values: torch.Tensor, inputs: ScoringInputs) -> torch.Tensor:
    """[N] per-token values back to [B, T], 0 at unscored positions (differentiable)."""
    zeros = torch.zeros(inputs.batch_shape, dtype=values.dtype, device=values.device)
    return zeros.index_put((inputs.rows, inputs.positions), values)
