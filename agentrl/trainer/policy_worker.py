"""Training stage: a causal LM sharded with FSDP2 that scores batches and takes PPO steps.

One class serves the trained policy (`trainable=True`: AdamW, `update`) and the frozen
reference policy (`trainable=False`: `compute_logprobs` only). Every rank receives the same
full TrainBatch; each rank works on its own slice of every (mini-)batch, and global token and
sequence counts make the loss independent of the number of ranks and micro-batches.
"""

from __future__ import annotations

import math
import shutil
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from transformers import AutoModelForCausalLM

from agentrl.trainer.actor_config import ActorConfig
from agentrl.trainer.batch import TrainBatch
from agentrl.trainer.distributed import all_gather_rows, all_reduce_sum, barrier, init_distributed
from agentrl.trainer.loss import METRIC_NAMES, micro_batch_loss

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
                self.model.parameters(), lr=optim.lr, betas=optim.betas, weight_decay=optim.weight_decay
            )
            warmup = optim.warmup_steps
            self.scheduler = torch.optim.lr_scheduler.LambdaLR(
                self.optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup else 1.0
            )

    def _build_model(self, dtype: torch.dtype) -> torch.nn.Module:
        # Master weights stay float32; `dtype` is the compute dtype of forward and backward.
        model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch.float32)
        model.to(self.context.device)
        model.eval()  # no dropout: old, new and reference logprobs must agree on identical weights
        model.requires_grad_(self.trainable)
        mixed_precision = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
        layer_classes = set(getattr(model, "_no_split_modules", None) or ())
        for module in model.modules():
            if type(module).__name__ in layer_classes:
                fully_shard(module, mesh=self.context.mesh, mp_policy=mixed_precision)
        fully_shard(model, mesh=self.context.mesh, mp_policy=mixed_precision)
        return model

    def _forward(self, micro: TrainBatch, with_entropy_grad: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Logprob of each token and entropy of the distribution that predicted it, [B, T] each."""
        micro = micro.to(self.context.device)
        logits = self.model(
            input_ids=micro.input_ids,
            attention_mask=micro.attention_mask,
            position_ids=micro.position_ids,
            use_cache=False,
        ).logits
        # The engine samples from log_softmax(logits / temperature); the ratio must use the same.
        log_probs = F.log_softmax(logits[:, :-1].float() / self.temperature, dim=-1)  # [B, T-1, V]
        token_logprobs = log_probs.gather(-1, micro.input_ids[:, 1:, None]).squeeze(-1)
        with torch.set_grad_enabled(with_entropy_grad and torch.is_grad_enabled()):
            entropy = -(log_probs.exp() * log_probs).sum(-1)
        # Position 0 has no predicting logit; it is never a loss token.
        return F.pad(token_logprobs, (1, 0)), F.pad(entropy, (1, 0))

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
    def compute_logprobs(self, batch: TrainBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """(logprobs [B, T], entropy [B, T]) of every token under this policy, on CPU, float32."""
        rows, _ = self._rank_rows(batch.num_sequences)
        local = batch.select(rows)
        outputs = [self._forward(local.select(chunk), False) for chunk in self._micro_chunks(len(rows))]
        logprobs = all_gather_rows(torch.cat([logprob for logprob, _ in outputs]))
        entropy = all_gather_rows(torch.cat([entropy for _, entropy in outputs]))
        return logprobs[: batch.num_sequences].cpu(), entropy[: batch.num_sequences].cpu()

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
        global_num_sequences = float((mini.loss_mask.sum(dim=-1) > 0).sum())
        rows, is_real = self._rank_rows(mini.num_sequences)
        local = mini.select(rows)
        local = replace(local, loss_mask=local.loss_mask * is_real[:, None])
        sums = torch.zeros(len(METRIC_NAMES), device=self.context.device)
        for chunk in self._micro_chunks(len(rows)):
            micro = local.select(chunk).to(self.context.device)
            logprobs, entropy = self._forward(micro, with_entropy_grad=self.actor.entropy_coeff > 0)
            loss, metrics = micro_batch_loss(
                logprobs, entropy, micro, self.actor, global_num_tokens, global_num_sequences
            )
            # FSDP averages gradients over ranks; the loss shares are meant to be summed.
            (loss * self.context.world_size).backward()
            sums += metrics
        return self._optimizer_step(all_reduce_sum(sums))

    def _optimizer_step(self, metric_sums: torch.Tensor) -> dict[str, float]:
        assert self.optimizer is not None and self.scheduler is not None
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.actor.grad_clip)
        grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
        lr = self.scheduler.get_last_lr()[0]
        if torch.isfinite(grad_norm):
            self.optimizer.step()
        # A non-finite gradient would poison the weights and the AdamW moments: skip the step.
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        metrics = dict(zip(METRIC_NAMES, metric_sums.tolist(), strict=True))
        metrics.update({"actor/grad_norm": float(grad_norm), "actor/lr": lr})
        return metrics

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Unsharded weights on CPU, keyed like the Hugging Face model; empty on ranks other than 0."""
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(self.model, options=options)

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
