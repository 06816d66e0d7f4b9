"""Inference stage: the built-in engine, a transformers causal LM behind continuous batching.

Callers (one asyncio task per agent) await `generate`; a single scheduler thread owns the
model. Each iteration it prefills waiting requests in a left-padded forward pass (a few passes
when group members wait for their shared prompt's blocks), then runs one decode step for every
running row: new requests join at the next decode step after their prefill and finished ones
leave at once (iteration-level scheduling). Results travel back to each caller's event loop
through its future.

Keys and values live in preallocated per-row slots (`slot_cache`), read in place by attention
that keeps grouped key/value heads unexpanded (`slot_attention`). A prefix cache
(`prefix_cache`) copies the keys/values of a prompt's already-seen start into the slot, so only
the rest is prefilled: a group's members share their prompt's prefill and a later turn reuses
the earlier turns'. A request whose prompt shares a block with one admitted in the same pass
is prefilled in the iteration's next pass, once that block is cached. How a pass runs on the
device (the engine's own fused forward for Llama and Qwen2 on CUDA, decode steps replayed as
captured graphs) is `model_runner`'s part.

Weight updates are fenced by submission order: `update_weights` waits until every request
submitted before it has finished on the old weights, then loads the new ones in place;
requests submitted after it wait and run entirely on the new weights.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import queue
import random
import threading
import time
from collections.abc import Callable
from typing import Any, Self

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from agentrl.engine.admission import admit
from agentrl.engine.engine_records import EngineStats, StepKind, StepRecord, WeightUpdate
from agentrl.engine.model_runner import ModelRunner
from agentrl.engine.model_setup import (
    check_full_attention,
    eos_ids,
    resolve_dtype,
    validate_state_dict,
)
from agentrl.engine.pending_decode import PendingDecode
from agentrl.engine.prefix_cache import PrefixCache
from agentrl.engine.protocol import FinishReason, Generation, SamplingParams
from agentrl.engine.request import Request, resolve_future
from agentrl.engine.sampling import (
    RowSampling,
    draw_uniforms,
    sample_next_tokens,
    stack_picked,
    validate_sampling,
)
from agentrl.engine.step_inputs import prefill_inputs

_SHUTDOWN = object()


class TransformersEngine:
    """Continuous-batching generation on a transformers causal LM (CPU or one GPU).

    `tokenizer_or_eos_ids`: a tokenizer (its EOS id plus the model's generation-config EOS
    ids stop a completion) or an explicit iterable of stop token ids (may be empty).
    Request ids in `StepRecord`s count up from 0 in submission order.
    `prefix_cache_bytes`: memory for cached prompt-prefix keys/values (0 turns the cache off);
    `prefix_block_size`: tokens per cached block, the granularity of prefix reuse;
    `cuda_graphs`: replay captured decode steps on CUDA, and the fused forward's prefill passes of up
    to 2,048 tokens (ignored on CPU, where none exist);
    `prefill_interval`: while rows decode, admit new requests only every this many decode steps,
    so that requests arriving one by one (turns ending) share fewer, larger prefill passes;
    `torch_compile`: compile each decoder layer's MLP and RMSNorms (`agentrl.compiled_layers`) for
    the passes transformers' modules run (CPU, models the fused forward does not serve);
    `fused_forward`: on CUDA, run Llama and Qwen2 models through the engine's own forward pass
    (`fused_decoder`: nine kernels a layer; its q/k/v and gate/up parameters become views of
    packed matrices). False runs transformers' modules, for comparison;
    `overlap_decode`: launch each decode step before reading the previous one's tokens, so the
    host's bookkeeping runs while the device computes (`pending_decode`); None: on CUDA only (on
    CPU the forward itself runs on the host, so there is nothing to overlap).
    The engine routes the model's attention through its own function (`slot_attention`);
    other forward calls on the model still compute plain SDPA attention.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer_or_eos_ids: Any,
        *,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | str | None = None,
        max_batch_size: int = 64,
        max_prefill_tokens: int = 8192,
        max_context_len: int | None = None,
        seed: int = 0,
        policy_version: int = 0,
        on_step: Callable[[StepRecord], None] | None = None,
        prefix_cache_bytes: int = 1 << 30,
        prefix_block_size: int = 16,
        cuda_graphs: bool = True,
        prefill_interval: int = 1,
        torch_compile: bool = False,
        fused_forward: bool = True,
        overlap_decode: bool | None = None,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size={max_batch_size} must be >= 1")
        if max_prefill_tokens < 1:
            raise ValueError(f"max_prefill_tokens={max_prefill_tokens} must be >= 1")
        if prefill_interval < 1:
            raise ValueError(
                f"prefill_interval={prefill_interval} must be >= 1 (1: admit at every decode step)"
            )
        if prefix_cache_bytes < 0:
            raise ValueError(f"prefix_cache_bytes={prefix_cache_bytes} must be >= 0 (0 turns the cache off)")
        check_full_attention(model)
        self.device = torch.device(device)
        self.model = model.to(device=self.device, dtype=resolve_dtype(dtype)).eval()
        self.eos_ids = eos_ids(model, tokenizer_or_eos_ids)
        self.vocab_size = model.get_input_embeddings().num_embeddings
        self.max_context_len = max_context_len or model.config.max_position_embeddings
        # Before the parameters are listed below: the fused forward packs some of them.
        self.runner = ModelRunner(self.model, device=self.device, max_batch_size=max_batch_size,
                                  max_context_len=self.max_context_len, cuda_graphs=cuda_graphs,
                                  torch_compile=torch_compile, fused_forward=fused_forward)  # fmt: skip
        self.max_batch_size = max_batch_size
        self.max_prefill_tokens = max_prefill_tokens
        self.prefill_interval = prefill_interval
        self._decodes_since_prefill = 0
        self.overlap_decode = self.device.type == "cuda" if overlap_decode is None else overlap_decode
        self._pending: PendingDecode | None = None  # a launched decode step whose tokens are unread
        self.policy_version = policy_version
        self.stats = EngineStats()
        self._on_step = on_step
        self._parameters = {name: t for name, t in model.state_dict().items()}
        self._param_shapes = {name: tuple(t.shape) for name, t in self._parameters.items()}
        self.prefix_cache = None
        if prefix_cache_bytes:
            # The pool is allocated up front, and committed memory counts even untouched: never
            # reserve more than four full batches of context could fill (small models on CPU).
            useful_bytes = 4 * max_batch_size * self.max_context_len * self.runner.slots.bytes_per_token
            self.prefix_cache = PrefixCache(
                self.runner.slots,
                block_size=prefix_block_size,
                budget_bytes=min(prefix_cache_bytes, useful_bytes),
            )
        self._seed_source = torch.Generator().manual_seed(seed)
        self._request_ids = itertools.count()
        # Orders submissions: request ids and seeds follow it, and nothing follows a shutdown.
        self._submit_lock = threading.Lock()
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._closed = False
        # Scheduler-thread state: only `_serve` and the methods it calls touch these.
        self._waiting: collections.deque[Request | WeightUpdate] = collections.deque()
        self._rows: list[Request] = []  # row i owns slot i of self.runner.slots
        self._thread = threading.Thread(target=self._serve, name="transformers-engine", daemon=True)
        self._thread.start()

    @classmethod
    def from_pretrained(
        cls, path: str, *, dtype: torch.dtype | str | None = None, **engine_kwargs: Any
    ) -> TransformersEngine:
        """Load a Hugging Face checkpoint directory (model + tokenizer) and serve it."""
        model = AutoModelForCausalLM.from_pretrained(path, dtype=resolve_dtype(dtype) or "auto")
        return cls(model, AutoTokenizer.from_pretrained(path), **engine_kwargs)

    # ---- caller side (any event loop, any thread) ----

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        """Sample one completion of `prompt_ids`; cancelling the caller frees its batch row."""
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
                seed = int(torch.randint(0, 2**62, (), generator=self._seed_source))
            request = Request(
                request_id=next(self._request_ids),
                prompt_ids=list(prompt_ids),
                sampling=sampling,
                max_new_tokens=budget,
                stop_ids=self.eos_ids | frozenset(sampling.stop_token_ids),
                generator=random.Random(seed),
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
        """Stop the scheduler; requests still waiting or running fail with RuntimeError."""
        with self._submit_lock:  # nothing can be queued behind the shutdown marker
            if self._closed:
                return
            self._closed = True
            self._inbox.put(_SHUTDOWN)
        await asyncio.to_thread(self._thread.join)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("TransformersEngine is closed; create a new engine to generate")

    def _validate_prompt(self, prompt_ids: list[int]) -> None:
        if len(prompt_ids) == 0:
            raise ValueError("prompt_ids is empty; the model needs at least one prompt token")
        low, high = min(prompt_ids), max(prompt_ids)
        if low < 0 or high >= self.vocab_size:
            bad = low if low < 0 else high
            raise ValueError(f"prompt token id {bad} is outside the vocabulary [0, {self.vocab_size})")

    # ---- scheduler thread ----

    def _serve(self) -> None:
        with torch.inference_mode():
            while self._take_commands():
                try:
                    self._iterate()
                # Anything a forward raises fails the rows it touched; the engine keeps serving.
                except Exception as error:  # noqa: BLE001
                    self._fail_rows(error)
        closed = RuntimeError("TransformersEngine was closed before this request finished")
        self._fail_rows(closed)
        for item in self._waiting:
            resolve_future(item.future, error=closed)

    def _take_commands(self) -> bool:
        """Move submitted commands into the waiting queue; False once shutdown was asked for."""
        block = not self._rows and not self._waiting and self._pending is None
        while True:
            try:
                command = self._inbox.get(block=block)
            except queue.Empty:
                return True
            if command is _SHUTDOWN:
                return False
            self._waiting.append(command)
            block = False

    def _iterate(self) -> None:
        """One scheduling iteration: drop cancelled, apply a due update, prefill, decode."""
        self._waiting = collections.deque(item for item in self._waiting if not item.cancelled)
        self._retire_rows()
        if not self._rows:
            self._read_pending_decode()  # only finished rows' dropped tokens are left in it
        if self._waiting and isinstance(self._waiting[0], WeightUpdate) and not self._rows:
            self._apply_update(self._waiting.popleft())
            return
        due = not self._rows or self._decodes_since_prefill >= self.prefill_interval
        budget = self.max_prefill_tokens if due else 0
        first_pass = True
        while budget > 0 and (admitted := self._admit(budget, first_pass)):
            budget -= self._prefill(admitted)
            first_pass = False
        if self._rows:
            self._decode()

    def _admit(self, budget: int, first_pass: bool) -> list[Request]:
        num_free_rows = self.max_batch_size - len(self._rows)
        return admit(self._waiting, num_free_rows=num_free_rows, budget=budget, first_pass=first_pass,
                     prefix_cache=self.prefix_cache, packed=self.runner.packed_prefill)  # fmt: skip

    def _prefill(self, requests: list[Request]) -> int:
        """One prefill pass over `requests`; returns the tokens it computed (padding too, unless packed)."""
        self._decodes_since_prefill = 0
        first_slot = len(self._rows)
        for request in requests:
            request.policy_version = self.policy_version
        self._rows.extend(requests)  # from here on a failure fails these rows too
        self.runner.grow_slots(max(len(r.prompt_ids) for r in requests))
        cached_lengths = self._reuse_prefixes(requests, first_slot)
        inputs = prefill_inputs([r.prompt_ids for r in requests], cached_lengths, first_slot)
        logits = self.runner.prefill(inputs, first_slot)
        self._sample(logits, requests)
        for request in requests:
            request.cache_length = len(request.prompt_ids)
        if self.prefix_cache is not None:
            self.prefix_cache.insert_from_slots(
                [(r.prompt_ids, first_slot + i) for i, r in enumerate(requests)]
            )
        self.stats.num_prompt_tokens += sum(len(r.prompt_ids) for r in requests)
        self.stats.num_prefix_cached_tokens += sum(cached_lengths)
        computed = inputs.write_index.numel() if self.runner.packed_prefill else inputs.input_ids.numel()
        self._record(StepKind.PREFILL, requests, num_tokens=computed)
        self._retire_rows()
        return computed

    def _reuse_prefixes(self, requests: list[Request], first_slot: int) -> list[int]:
        """Copy each prompt's cached start into its slot; returns how many positions each covers."""
        if self.prefix_cache is None:
            return [0] * len(requests)
        matches = [self.prefix_cache.lookup(r.prompt_ids) for r in requests]
        self.prefix_cache.copy_into_slots([(match, first_slot + i) for i, match in enumerate(matches)])
        # The last prompt token is always fed: its logits give the first completion token.
        return [min(m.num_tokens, len(r.prompt_ids) - 1) for m, r in zip(matches, requests, strict=True)]

    def _decode(self) -> None:
        """Launch a decode step for every running row; then read the previous step's tokens.

        With overlap, the host reads step N's tokens while the device runs step N+1, which was
        launched before the host knew which rows step N finished: such a row computes one extra
        token in step N+1, which is dropped (the key/value it stores, its last kept token's, is valid).
        """
        previous, self._pending = self._pending, self._launch_decode(self._pending)
        if previous is not None:
            self._finish_decode(previous)
        if not self.overlap_decode:
            self._read_pending_decode()

    def _launch_decode(self, previous: PendingDecode | None) -> PendingDecode:
        requests = list(self._rows)
        positions = [r.cache_length for r in requests]
        self.runner.grow_slots(max(positions) + 1)
        # A row the previous step decoded continues from that step's sample, still on the device.
        sources = [-1] * len(requests) if previous is None else previous.rows_of(requests)
        host_ids = [
            0 if source >= 0 else r.completion_ids[-1] for r, source in zip(requests, sources, strict=True)
        ]
        params = [r.sampling for r in requests]
        uniforms = draw_uniforms(params, [r.generator for r in requests])
        picked = self.runner.decode(self.runner.stage_decode(positions, sources, host_ids, params, uniforms))
        for request in requests:
            request.cache_length += 1
        self._decodes_since_prefill += 1
        return PendingDecode.launch(requests, picked)

    def _finish_decode(self, step: PendingDecode) -> None:
        """Append a launched step's tokens to the rows it did not find finished; retire finished rows."""
        live = []  # rows finished by an earlier step (or cancelled since the launch) keep no token
        for request, token_id, logprob in zip(step.requests, *step.read(), strict=True):
            if request.finish_reason is None and not request.cancelled:
                request.append(int(token_id), logprob)
                live.append(request)
        if live:
            self.stats.num_generated_tokens += len(live)
            self._record(StepKind.DECODE, live, num_tokens=len(step.requests))
        self._retire_rows()

    def _read_pending_decode(self) -> None:
        """Finish the launched decode step, if any (before admitting, updating weights or idling)."""
        if self._pending is not None:
            step, self._pending = self._pending, None
            self._finish_decode(step)

    def _sample(self, logits: torch.Tensor, requests: list[Request]) -> None:
        sampling = RowSampling.build(
            [r.sampling for r in requests], [r.generator for r in requests], self.device
        )
        picked = PendingDecode.launch(requests, stack_picked(*sample_next_tokens(logits, sampling)))
        for request, token_id, logprob in zip(requests, *picked.read(), strict=True):
            request.append(int(token_id), logprob)
        self.stats.num_generated_tokens += len(requests)

    def _retire_rows(self) -> None:
        """Answer finished rows and drop them, with cancelled ones; the last rows fill their slots."""
        done = [i for i, r in enumerate(self._rows) if r.finish_reason is not None or r.cancelled]
        if not done:
            return
        finished = [(slot, self._rows[slot]) for slot in done if self._rows[slot].finish_reason is not None]
        if self.prefix_cache is not None:
            self.prefix_cache.insert_from_slots(
                [(r.cached_token_ids(), slot) for slot, r in finished if not r.cancelled]
            )
        for _, request in finished:
            resolve_future(request.future, result=request.generation())
        num_kept = len(self._rows) - len(done)
        done_set = set(done)
        holes = [slot for slot in done if slot < num_kept]
        movers = [slot for slot in range(num_kept, len(self._rows)) if slot not in done_set]
        self.runner.slots.move_slots(movers, holes, [self._rows[slot].cache_length for slot in movers])
        for hole, mover in zip(holes, movers, strict=True):
            self._rows[hole] = self._rows[mover]
        del self._rows[num_kept:]

    def _record(self, kind: StepKind, requests: list[Request], num_tokens: int) -> None:
        if kind is StepKind.PREFILL:
            self.stats.num_prefill_steps += 1
        else:
            self.stats.num_decode_steps += 1
        if self._on_step is not None:
            self._on_step(StepRecord(kind, tuple(r.request_id for r in requests), num_tokens))

    def _apply_update(self, update: WeightUpdate) -> None:
        """Copy the new weights into the parameters in place (same storage, so graphs stay valid)."""
        try:
            if self.prefix_cache is not None:
                self.prefix_cache.clear()  # keys/values computed by the old weights
            start = time.perf_counter()
            for name, tensor in update.state_dict.items():
                self._parameters[name].copy_(tensor)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)  # the caller may reuse its tensors once we answer
            self.stats.weight_sync_seconds = time.perf_counter() - start
            self.policy_version = update.version
        except Exception as error:  # noqa: BLE001 - the caller of update_weights gets it
            resolve_future(update.future, error=error)
        else:
            resolve_future(update.future, result=None)

    def _fail_rows(self, error: BaseException) -> None:
        self._pending = None  # its unfinished rows are among self._rows
        for request in self._rows:
            resolve_future(request.future, error=error)
        self._rows = []
