"""Training stage settings: how the policy worker turns a batch into optimizer steps (verl names)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from agentrl.algorithms.config import LossAggMode, parse_kl_kind


class OptimConfig(BaseModel):
    """AdamW settings of the policy."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    lr: float = Field(1e-6, gt=0, description="Peak learning rate.")
    weight_decay: float = Field(0.01, ge=0, description="AdamW decoupled weight decay.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW (beta1, beta2).")
    warmup_steps: int = Field(0, ge=0, description="Optimizer steps of linear warm-up from 0 to lr.")


class ActorConfig(BaseModel):
    """PPO update of the policy: batching, clipping, KL and entropy terms, loss aggregation."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    ppo_mini_batch_size: int = Field(
        16, ge=1, description="Prompts (groups) per optimizer step; times rollout.n sequences, as in verl."
    )
    ppo_micro_batch_size_per_gpu: int = Field(
        16, ge=1, description="Sequences per forward/backward pass on one rank (gradient accumulation)."
    )
    ppo_epochs: int = Field(1, ge=1, description="Passes over the batch per training step.")
    clip_ratio_low: float = Field(0.2, ge=0, description="Ratio is clipped below at 1 - clip_ratio_low.")
    clip_ratio_high: float = Field(
        0.2, ge=0, description="Ratio is clipped above at 1 + clip_ratio_high (DAPO clip-higher: > low)."
    )
    clip_ratio_c: float = Field(
        3.0, gt=1, description="Dual-clip bound: loss of a negative-advantage token is at most -A * c."
    )
    loss_agg_mode: LossAggMode = Field("token-mean", description="How per-token losses become one scalar.")
    loss_scale_factor: int | None = Field(
        None,
        ge=1,
        description="Constant L of seq-mean-token-sum-norm; None uses the padded length of the batch's tensor.",
    )
    use_kl_loss: bool = Field(False, description="Add kl_loss_coef * KL(policy || reference) to the loss.")
    kl_loss_coef: float = Field(0.001, ge=0, description="Weight of the KL loss.")
    kl_loss_type: str = Field(
        "low_var_kl",
        description="k1/kl, k2/mse, k3/low_var_kl or abs; '+' suffix: k2 gradient (straight-through).",
    )
    entropy_coeff: float = Field(
        0.0, ge=0, description="Weight of the entropy bonus (subtracted from the loss)."
    )
    report_entropy: bool = Field(
        False,
        description="Compute actor/entropy even when entropy_coeff is 0 (one more pass over the vocabulary per token).",
    )
    sequence_packing: bool = Field(
        True,
        description="Concatenate a micro-batch's sequences into one row with per-sequence causal attention: no padding.",
    )
    gradient_checkpointing: bool = Field(
        False,
        description="Recompute each decoder layer's activations in backward instead of storing them (less memory, ~1/3 more compute).",
    )
    use_torch_compile: bool = Field(
        False,
        description=(
            "Compile each decoder layer's forward, and the head's per-chunk float32 work, with "
            "torch.compile (fused elementwise work; the first step compiles)."
        ),
    )
    logprob_chunk_size: int = Field(
        4096,
        ge=1,
        description=(
            "Tokens per chunk of the language-model head; bounds its float32 [chunk, vocab] logits "
            "(4,096 x 152k vocabulary: 2.5 GB)."
        ),
    )
    grad_clip: float = Field(1.0, gt=0, description="Max global L2 norm of the gradient.")
    optim: OptimConfig = Field(default_factory=OptimConfig, description="Optimizer settings.")

    @field_validator("kl_loss_type")
    @classmethod
    def _known_kl_type(cls, value: str) -> str:
        parse_kl_kind(value)
        return value
