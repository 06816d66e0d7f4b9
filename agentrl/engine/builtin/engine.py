"""Inference stage: the built-in engine, a transformers causal LM behind continuous batching.

Callers (one asyncio task per agent) await `generate`; a single scheduler thread
(`scheduler`) owns the model. Each iteration it prefills waiting requests in one forward pass
(a few passes when group members wait for their shared prompt's blocks), then runs
one decode step for every running row: new requests join at the next decode step after their
prefill and finished ones leave at once (iteration-level scheduling). Results travel back to
each caller's event loop through its future.

Keys and values live in preallocated per-row slots (`slot_cache`), read in place by attention
that keeps grouped key/value heads unexpanded (`slot_attention`). A prefix cache
(`prefix_cache`) copies the keys/values of a prompt's already-seen start into the slot, so only
the rest is prefilled: a group's members share their prompt's prefill and a later turn reuses
the earlier turns'. A request whose prompt shares a block with one admitted in the same pass
is prefilled in the iteration's next pass, once that block is cached. How a pass runs on the
device (the engine's own fused forward for Llama-like models on CUDA, decode steps replayed as
captured graphs) is `model_runner`'s part.

Weight updates are fenced by submission order: `update_weights` waits until every request
submitted before it has finished on the old weights, then loads the new ones in place;
requests submitted after it wait and run entirely on the new weights.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import random
import threading
from collections.abc import Callable
from typing import Any, Self

import torch
from transformers import AutoTokenizer, PreTrainedModel

from agentrl.devices import resolve_device
from agentrl.engine.builtin.cache.prefix_cache import PrefixCache
from agentrl.engine.builtin.model.model_setup import (
    check_full_attention,
    eos_ids,
    resolve_dtype,
    validate_state_dict,
)
from agentrl.engine.builtin.runner.model_runner import ModelRunner
from agentrl.engine.builtin.runner.sampling import validate_sampling
from agentrl.engine.builtin.scheduler.records import EngineStats, StepRecord, WeightUpdate
from agentrl.engine.builtin.scheduler.request import Request
from agentrl.engine.builtin.scheduler.scheduler import SHUTDOWN, Scheduler
from agentrl.engine.config import EngineConfig
from agentrl.engine.protocol import FinishReason, Generation, SamplingParams
from agentrl.model_path import load_causal_lm

# Decode steps launched ahead of the host's reading on CUDA: a few milliseconds of device work
# that covers the host's shorter pauses. A row finished by a stop token computes that many tokens
# to drop (one at its budget leaves in time). On the single-turn 0.5B engine benchmark 4 was faster
# than 1 and no slower than 2, 8 or 16 (docs/engine_design_notes.md).
CUDA_DECODE_LOOKAHEAD = 4


class TransformersEngine:
    """Continuous-batching generation on a transformers causal LM (CPU or one GPU).

    `tokenizer_or_eos_ids`: a tokenizer (its EOS id plus the model's generation-config EOS
    ids stop a completion) or an explicit iterable of stop token ids (may be empty).
    Request ids in `StepRecord`s count up from 0 in submission order.
    `config`: the `engine` section (`EngineConfig`; None: its defaults). Its built-in knobs, as the
    engine reads them:
    `device`: auto is CUDA where available;
    `prefix_cache_bytes`: memory for cached prompt-prefix keys/values (0 turns the cache off);
    `prefix_block_size`: tokens per cached block, the granularity of prefix reuse;
    `cuda_graphs`: replay captured decode steps on CUDA, and the fused forward's prefill passes of up
    to 2,048 tokens (ignored on CPU, where none exist);
    `prefill_interval`: while rows decode, admit new requests only every this many decode steps,
    so that requests arriving one by one (turns ending) share fewer, larger prefill passes;
    `torch_compile`: compile each decoder layer's MLP and RMSNorms (`agentrl.compiled_layers`) for
    the passes transformers' modules run (CPU, models the fused forward does not serve);
    `fused_forward`: on CUDA, run Llama, Mistral, Qwen2 and Qwen3 models through the engine's own
    forward pass (`fused_decoder`: nine kernels a layer; its q/k/v and gate/up parameters become views of
    packed matrices). False runs transformers' modules, for comparison;
    `decode_lookahead`: decode steps launched before the host reads a step's tokens: step N is
    read once step N + lookahead is launched, each row of a step fed its previous token straight
    from the device (`pending_step`). The device then keeps running while the host does its
    bookkeeping, prepares the next prefill pass, or is paused (by the OS, by another thread) for
    up to that many steps; a row that a stop token finished computes up to that many more tokens,
    dropped (a row at its token budget leaves the batch in time).
    0 reads every step before launching the next; None: `CUDA_DECODE_LOOKAHEAD` on CUDA, 0 on CPU
    (where the forward itself runs on the host, so there is nothing to overlap).
    The engine routes the model's attention through its own function (`slot_attention`);
    other forward calls on the model still compute plain SDPA attention.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer_or_eos_ids: Any,
        config: EngineConfig | None = None,
        *,
        dtype: torch.dtype | str | None = None,
        max_context_len: int | None = None,
        seed: int = 0,
        policy_version: int = 0,
        on_step: Callable[[StepRecord], None] | None = None,
    ) -> None:
        config = EngineConfig() if config is None else config
        if config.backend != "transformers":
            raise ValueError(
                f"TransformersEngine is engine.backend=transformers; got {config.backend} (use build_engine)"
            )
        self.max_context_len = max_context_len or model.config.max_position_embeddings
        check_full_attention(model, self.max_context_len)
        self.config = config
        self.device = torch.device(resolve_device(config.device, "engine.device"))
        self.model = model.to(device=self.device, dtype=resolve_dtype(dtype)).eval()
        self.eos_ids = eos_ids(model, tokenizer_or_eos_ids)
        decode_lookahead = config.decode_lookahead
        if decode_lookahead is None:
            decode_lookahead = CUDA_DECODE_LOOKAHEAD if self.device.type == "cuda" else 0
        max_batch_size = config.max_batch_size
        # Before the parameters are listed below: the fused forward packs some of them.
        self.runner = ModelRunner(self.model, device=self.device, max_batch_size=max_batch_size,
                                  max_context_len=self.max_context_len, cuda_graphs=config.cuda_graphs,
                                  torch_compile=config.torch_compile, fused_forward=config.fused_forward,
                                  decode_lookahead=decode_lookahead)  # fmt: skip
        self.max_batch_size = max_batch_size
        self.prefill_interval = config.prefill_interval
        self.decode_lookahead = decode_lookahead
        self.stats = EngineStats()
        parameters = dict(model.state_dict())
        self._param_shapes = {name: tuple(t.shape) for name, t in parameters.items()}
        self.prefix_cache = None
        if config.prefix_cache_bytes:
            # The pool is allocated up front, and committed memory counts even untouched: never
            # reserve more than four full batches of context could fill (small models on CPU).
            useful_bytes = 4 * max_batch_size * self.max_context_len * self.runner.slots.bytes_per_token
            self.prefix_cache = PrefixCache(
                self.runner.slots,
                block_size=config.prefix_block_size,
                budget_bytes=min(config.prefix_cache_bytes, useful_bytes),
            )
        self._seed_source = random.Random(seed)  # seeds of requests that bring none
        self._request_ids = itertools.count()
        # Orders submissions: request ids and seeds follow it, and nothing follows a shutdown.
        self._submit_lock = threading.Lock()
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._closed = False
        self._scheduler = Scheduler(
            self.runner, self.prefix_cache, self.stats, self._inbox, parameters,
            max_batch_size=max_batch_size, max_prefill_tokens=config.max_prefill_tokens,
            prefill_interval=config.prefill_interval, policy_version=policy_version, on_step=on_step,
            decode_lookahead=decode_lookahead,
        )  # fmt: skip
        self._thread = threading.Thread(target=self._scheduler.serve, name="transformers-engine", daemon=True)
        self._thread.start()

    @property
    def policy_version(self) -> int:
        """The version of the weights requests now start on (the last applied update's)."""
        return self._scheduler.policy_version

    @classmethod
    def from_pretrained(
        cls,
        path: str,
        config: EngineConfig | None = None,
        *,
        dtype: torch.dtype | str | None = None,
        **engine_kwargs: Any,
    ) -> TransformersEngine:
        """Load a Hugging Face checkpoint directory (model + tokenizer) and serve it."""
        model = load_causal_lm(path, dtype=resolve_dtype(dtype) or "auto")
        return cls(model, AutoTokenizer.from_pretrained(path), config, **engine_kwargs)

    # ---- caller side (any event loop, any thread) ----

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        """Sample one completion of `prompt_ids`; cancelling the caller frees its batch row.

        Raises ValueError for bad sampling settings or an empty prompt at once, and for a prompt
        token id outside the vocabulary when the scheduler reaches the request, before its pass.
        """
        validate_sampling(sampling)
        self._validate_prompt(prompt_ids)
        budget = min(sampling.max_new_tokens, self.max_context_len - len(prompt_ids))
        if budget <= 0:  # the prompt alone fills the context: nothing can be generated
            return Generation([], [], FinishReason.LENGTH, self.policy_version)
        loop = asyncio.get_running_loop()
        with self._submit_lock:
            self._check_open()
            seed = sampling.seed
            if seed is None:
                seed = self._seed_source.getrandbits(62)
            request = Request(
                request_id=next(self._request_ids),
                prompt_ids=list(prompt_ids),
                sampling=sampling,
                max_new_tokens=budget,
                stop_ids=self.eos_ids | frozenset(sampling.stop_token_ids),
                seed=seed,
                future=loop.create_future(),
            )
            self._inbox.put(request)
        try:
            return await request.future
        except asyncio.CancelledError:
            request.cancelled = True  # read by the scheduler at its next step
            raise

    async def update_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """Load `state_dict` (all or some parameters) once earlier requests have finished."""
        validate_state_dict(state_dict, self._param_shapes)
        update = WeightUpdate(state_dict, version, asyncio.get_running_loop().create_future())
        with self._submit_lock:
            self._check_open()
            self._inbox.put(update)
        await update.future

    async def close(self) -> None:
        """Stop the scheduler; requests still waiting or running fail with RuntimeError.

        The CUDA graphs go at once; the key/value slots and the prefix cache go with the engine
        object, as soon as nothing refers to it.
        """
        with self._submit_lock:  # nothing can be queued behind the shutdown marker
            if self._closed:
                return
            self._closed = True
            self._inbox.put(SHUTDOWN)
        await asyncio.to_thread(self._thread.join)
        self.runner.drop_graphs()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("TransformersEngine is closed; create a new engine to generate")

    def _validate_prompt(self, prompt_ids: list[int]) -> None:
        # Token ids are checked by the scheduler, vectorised over a pass (`PrefillRows.out_of_vocabulary`).
        if len(prompt_ids) == 0:
            raise ValueError("prompt_ids is empty; the model needs at least one prompt token")
