"""Training stage: a causal LM sharded with FSDP2 that scores batches and takes PPO steps.

One class serves the trained policy (`trainable=True`: AdamW, `update`) and the frozen
reference policy (`trainable=False`: `compute_logprobs` only). Every rank receives the same
full TrainBatch; each rank works on its own slice of every (mini-)batch, and global token and
sequence counts make the loss independent of the number of ranks and micro-batches.
"""

from __future__ import annotations

import functools
import math
import shutil
from dataclasses import replace
from pathlib import Path

import torch
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.utils.checkpoint import checkpoint

from agentrl.algorithms.aggregation import sequence_counts
from agentrl.compiled_layers import compile_layer, decoder_layers
from agentrl.model_path import load_causal_lm
from agentrl.trainer.actor_config import ActorConfig
from agentrl.trainer.batch import TrainBatch
from agentrl.trainer.distributed import all_gather_rows, all_reduce_sum, barrier, init_distributed
from agentrl.trainer.document_attention import register_document_attention
from agentrl.trainer.loss import METRIC_NAMES, TokenLoss, micro_batch_loss
from agentrl.trainer.packing import ScoringInputs, scatter_scores, scoring_inputs
from agentrl.trainer.scorer import CausalLMScorer
from agentrl.trainer.token_logprobs import TokenScores

# Files of a Hugging Face checkpoint that belong to the tokenizer and chat template.
TOKENIZER_FILES = (
    "tokenizer*",
    "vocab*",
    "merges.txt",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template*",
    "*.tiktoken",
)


class PolicyWorker:
    """A transformers causal LM wrapped with FSDP2 on all ranks of the default process group."""

    # What turns hidden states into token scores; benchmarks/trainer_throughput.py swaps in the
    # previous full-logits path to measure against it.
    scorer_class: type[CausalLMScorer] = CausalLMScorer

    def __init__(
        self,
        model_path: str | Path,
        actor: ActorConfig,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        trainable: bool = True,
        temperature: float = 1.0,
    ) -> None:
        if temperature <= 0:
            raise ValueError(
                f"temperature must be > 0 (the engine's sampling temperature), got {temperature}"
            )
        self.model_path = Path(model_path)
        self.actor = actor
        self.trainable = trainable
        self.temperature = temperature
        self.context = init_distributed(device)
        self.model = self._build_model(dtype)
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: torch.optim.lr_scheduler.LRScheduler | None = None
        if trainable:
            optim = actor.optim
            self.optimizer = torch.optim.AdamW(
                self.model.parameters(),
                lr=optim.lr,
                betas=optim.betas,
                weight_decay=optim.weight_decay,
                fused=True,  # one kernel per step, and it can skip a step without a host sync (found_inf)
            )
            warmup = optim.warmup_steps
            self.scheduler = torch.optim.lr_scheduler.LambdaLR(
                self.optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup else 1.0
            )

    def _build_model(self, dtype: torch.dtype) -> torch.nn.Module:
        # Master weights stay float32; `dtype` is the compute dtype of forward and backward.
        attention = (
            {"attn_implementation": register_document_attention()} if self.actor.sequence_packing else {}
        )
        model = load_causal_lm(self.model_path, dtype=torch.float32, **attention)
        model.to(self.context.device)
        model.eval()  # no dropout: old, new and reference logprobs must agree on identical weights
        model.requires_grad_(self.trainable)
        self.scorer = self.scorer_class(
            model, self.temperature, self.actor.logprob_chunk_size, compiled_head=self.actor.use_torch_compile
        )
        mixed_precision = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
        # The root's inputs include the loss's float32 per-token values (TokenLoss): never cast them.
        root_precision = replace(mixed_precision, cast_forward_inputs=False)
        for layer in decoder_layers(model):
            if self.actor.use_torch_compile:
                compile_layer(layer)
            if self.actor.gradient_checkpointing:
                # Checkpoint the layer's forward, not its __call__: FSDP's hooks stay outside, so
                # the layer's weights are gathered again for the recompute in backward.
                layer.forward = functools.partial(checkpoint, layer.forward, use_reentrant=False)
            fully_shard(layer, mesh=self.context.mesh, mp_policy=mixed_precision)
        # The scorer is the root: its forward, not the model's, is what every pass calls.
        fully_shard(self.scorer, mesh=self.context.mesh, mp_policy=root_precision)
        return model

    def _scoring_inputs(self, micro: TrainBatch) -> ScoringInputs:
        return scoring_inputs(
            micro.input_ids,
            micro.attention_mask,
            micro.position_ids,
            micro.loss_mask > 0,
            pack=self.actor.sequence_packing,
        ).to(self.context.device)

    def _forward(self, micro: TrainBatch, with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logprob of each scored token and (if asked) its predicting distribution's entropy, [B, T] each.

        Scored tokens are those with loss mask 1; every other position holds 0.
        """
        inputs = self._scoring_inputs(micro)
        scores, _ = self.scorer(inputs, with_entropy)
        return _scattered(scores, inputs)

    def _rank_rows(self, num_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's contiguous slice of `num_rows` rows, and which of them are real.

        Every rank gets the same count so that all ranks run the same number of forward passes
        (FSDP's collectives need that); the shortfall is filled by repeating the last row, whose
        results are dropped (logprobs) or whose loss mask is zeroed (update).
        """
        per_rank = math.ceil(num_rows / self.context.world_size)
        rows = torch.arange(self.context.rank * per_rank, (self.context.rank + 1) * per_rank)
        return rows.clamp(max=num_rows - 1), rows < num_rows

    @torch.no_grad()
    def compute_logprobs(
        self, batch: TrainBatch, with_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(logprobs [B, T], entropy [B, T] or None) of the loss-mask tokens, 0 elsewhere; CPU, float32.

        The entropy is computed (and gathered over ranks) only when `with_entropy` is set.
        """
        rows, _ = self._rank_rows(batch.num_sequences)
        local = batch.select(rows)
        outputs = [
            self._forward(local.select(chunk), with_entropy) for chunk in self._micro_chunks(len(rows))
        ]
        logprobs = all_gather_rows(torch.cat([logprob for logprob, _ in outputs]))[: batch.num_sequences]
        if not with_entropy:
            return logprobs.cpu(), None
        entropy = all_gather_rows(torch.cat([entropy for _, entropy in outputs]))
        return logprobs.cpu(), entropy[: batch.num_sequences].cpu()

    def _micro_chunks(self, num_rows: int) -> list[torch.Tensor]:
        return list(torch.arange(num_rows).split(self.actor.ppo_micro_batch_size_per_gpu))

    def _mini_batches(self, batch: TrainBatch) -> list[torch.Tensor]:
        """Row indices of each mini-batch: ppo_mini_batch_size whole groups, in order of first appearance."""
        groups = list(dict.fromkeys(batch.group_ids.tolist()))
        size = self.actor.ppo_mini_batch_size
        chunks = [set(groups[start : start + size]) for start in range(0, len(groups), size)]
        return [
            torch.tensor([i for i, g in enumerate(batch.group_ids.tolist()) if g in chunk])
            for chunk in chunks
        ]

    def update(self, batch: TrainBatch) -> dict[str, float]:
        """ppo_epochs passes of one optimizer step per mini-batch; returns metrics averaged over steps."""
        if self.optimizer is None:
            raise ValueError(
                "update() needs a trainable PolicyWorker; this one was built with trainable=False"
            )
        if batch.old_logprobs is None:
            raise ValueError("batch.old_logprobs is None: fill it with compute_logprobs() before update()")
        if self.actor.use_kl_loss and batch.ref_logprobs is None:
            raise ValueError(
                "actor.use_kl_loss is set but batch.ref_logprobs is None: fill it from the reference"
            )
        totals: dict[str, float] = {}
        steps = [mini for _ in range(self.actor.ppo_epochs) for mini in self._mini_batches(batch)]
        for mini_rows in steps:
            for name, value in self._step(batch.select(mini_rows)).items():
                totals[name] = totals.get(name, 0.0) + value
        return {name: value / len(steps) for name, value in totals.items()}

    def _step(self, mini: TrainBatch) -> dict[str, float]:
        """One optimizer step on a mini-batch, accumulating gradients over micro-batches."""
        global_num_tokens = float(mini.loss_mask.sum())
        # Episodes, not rows: the samples of an episode are one sequence (agentrl.algorithms.aggregation).
        # Mini-batches hold whole groups, so an episode's samples are never split between two.
        sequence_num_tokens, global_num_sequences = sequence_counts(mini.loss_mask, mini.episode_ids)
        rows, is_real = self._rank_rows(mini.num_sequences)
        local = mini.select(rows)
        local = replace(local, loss_mask=local.loss_mask * is_real[:, None])
        sums = torch.zeros(len(METRIC_NAMES), device=self.context.device)
        for chunk in self._micro_chunks(len(rows)):
            micro = local.select(chunk)
            micro_sequence_num_tokens = sequence_num_tokens[rows[chunk]].to(self.context.device)
            inputs = self._scoring_inputs(micro)
            micro = micro.to(self.context.device)
            token_loss = TokenLoss.of(
                micro, inputs.rows, inputs.positions, self.actor, global_num_tokens, global_num_sequences,
                micro_sequence_num_tokens,
            )  # fmt: skip
            scores, loss = self.scorer(inputs, self._wants_entropy, token_loss)
            # FSDP averages gradients over ranks; the loss shares are meant to be summed.
            (loss * self.context.world_size).backward()
            with torch.no_grad():
                logprobs, entropy = _scattered(scores, inputs)
                _, metrics = micro_batch_loss(
                    logprobs, entropy, micro, self.actor, global_num_tokens, global_num_sequences,
                    micro_sequence_num_tokens,
                )  # fmt: skip
            sums += metrics
        metrics = self._optimizer_step(all_reduce_sum(sums))
        if not self._wants_entropy:
            del metrics["actor/entropy"]  # never computed: reporting 0 would be a lie
        return metrics

    @property
    def _wants_entropy(self) -> bool:
        return self.actor.entropy_coeff > 0 or self.actor.report_entropy

    def _optimizer_step(self, metric_sums: torch.Tensor) -> dict[str, float]:
        assert self.optimizer is not None and self.scheduler is not None
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.actor.grad_clip)
        grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
        lr = self.scheduler.get_last_lr()[0]
        # A non-finite gradient would poison the weights and the AdamW moments: the fused kernel
        # skips the step where `found_inf` is 1 (the grad scaler's protocol). Decided on the
        # device, so the host queues the step without waiting for the gradient norm.
        self.optimizer.found_inf = (~torch.isfinite(grad_norm)).float()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        metrics = dict(zip(METRIC_NAMES, metric_sums.tolist(), strict=True))
        metrics.update({"actor/grad_norm": float(grad_norm), "actor/lr": lr})
        return metrics

    def full_state_dict(
        self, device: str | torch.device | None = "cpu", dtype: torch.dtype | None = None
    ) -> dict[str, torch.Tensor]:
        """Unsharded weights keyed like the Hugging Face model, on every rank.

        `device="cpu"` (the default) gives CPU copies; `device=None` leaves them on this worker's
        device, so an engine on the same GPU can copy them in without a round trip through host
        memory. `dtype` (e.g. the engine's bfloat16) casts each shard before it is gathered, which
        also halves the bytes gathered. Tied weights stay one tensor under both names.
        """
        target = self.context.device if device is None else torch.device(device)
        gathered: dict[int, torch.Tensor] = {}
        state_dict = {}
        for name, tensor in self.model.state_dict(keep_vars=True).items():
            if id(tensor) not in gathered:
                local = tensor.detach() if dtype is None else tensor.detach().to(dtype)
                full = local.full_tensor() if isinstance(local, DTensor) else local
                # copy=True: with one rank the gathered tensor can be the live parameter itself.
                gathered[id(tensor)] = full.to(target, copy=True)
            state_dict[name] = gathered[id(tensor)]
        return state_dict

    def save_hf(self, path: str | Path) -> None:
        """Write a Hugging Face checkpoint to `path`: config and weights, plus model_path's tokenizer files."""
        state_dict = self.full_state_dict()  # every rank takes part in the gather
        if self.context.is_main:
            path = Path(path)
            path.mkdir(parents=True, exist_ok=True)
            self.model.save_pretrained(path, state_dict=state_dict)
            # Byte-for-byte copies: a load/save round trip through transformers may rewrite them.
            for pattern in TOKENIZER_FILES:
                for source in self.model_path.glob(pattern):
                    shutil.copy2(source, path / source.name)
        barrier()


def _scattered(scores: TokenScores, inputs: ScoringInputs) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logprobs, entropy or None) back in the micro-batch's [B, T] layout."""
    entropy = None if scores.entropy is None else scatter_scores(scores.entropy, inputs)
    return scatter_scores(scores.logprobs, inputs), entropy
