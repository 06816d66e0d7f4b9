"""Inference stage: the built-in engine, a transformers causal LM behind continuous batching.

Callers (one asyncio task per agent) await `generate`; a single scheduler thread owns the
model. Each iteration it prefills waiting requests in one left-padded forward pass, then runs
one decode step for every running row: new requests join at the next decode step after their
prefill and finished ones leave at once (iteration-level scheduling). Results travel back to
each caller's event loop through its future.

Weight updates are fenced by submission order: `update_weights` waits until every request
submitted before it has finished on the old weights, then loads the new ones in place;
requests submitted after it wait and run entirely on the new weights.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import itertools
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Self

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache, PreTrainedModel

from agentrl.engine.kv_batch import KVBatch, PrefillInputs, Request
from agentrl.engine.model_setup import (
    attention_backends,
    check_full_attention,
    eos_ids,
    resolve_dtype,
    validate_state_dict,
)
from agentrl.engine.protocol import FinishReason, Generation, SamplingParams
from agentrl.engine.sampling import RowSampling, sample_next_tokens, validate_sampling

_SHUTDOWN = object()


class StepKind(str, enum.Enum):
    """Which kind of forward pass the scheduler ran."""

    PREFILL = "prefill"  # prompts of newly admitted requests, left-padded into one pass
    DECODE = "decode"  # one new token for every running row


@dataclass(frozen=True)
class StepRecord:
    """One forward pass, as reported to the engine's `on_step` observer."""

    kind: StepKind
    request_ids: tuple[int, ...]  # the rows of this forward pass, in batch order
    num_tokens: int  # input positions computed, padding included


@dataclass
class EngineStats:
    """Counters since the engine started; written by the scheduler thread only."""

    num_prefill_steps: int = 0
    num_decode_steps: int = 0
    num_generated_tokens: int = 0


@dataclass(eq=False)
class WeightUpdate:
    """A queued `update_weights` call; applied once no row is running."""

    state_dict: dict[str, torch.Tensor]
    version: int
    future: asyncio.Future
    cancelled: bool = field(default=False, init=False)  # updates are never dropped


class TransformersEngine:
    """Continuous-batching generation on a transformers causal LM (CPU or one GPU).

    `tokenizer_or_eos_ids`: a tokenizer (its EOS id plus the model's generation-config EOS
    ids stop a completion) or an explicit iterable of stop token ids (may be empty).
    Request ids in `StepRecord`s count up from 0 in submission order.
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
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size={max_batch_size} must be >= 1")
        if max_prefill_tokens < 1:
            raise ValueError(f"max_prefill_tokens={max_prefill_tokens} must be >= 1")
        check_full_attention(model)
        self.device = torch.device(device)
        self.model = model.to(device=self.device, dtype=resolve_dtype(dtype)).eval()
        self.eos_ids = eos_ids(model, tokenizer_or_eos_ids)
        self.vocab_size = model.get_input_embeddings().num_embeddings
        self.max_context_len = max_context_len or model.config.max_position_embeddings
        self.max_batch_size = max_batch_size
        self.max_prefill_tokens = max_prefill_tokens
        self.policy_version = policy_version
        self.stats = EngineStats()
        self._on_step = on_step
        self._param_shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
        self._seed_source = torch.Generator().manual_seed(seed)
        self._request_ids = itertools.count()
        # Orders submissions: request ids and seeds follow it, and nothing follows a shutdown.
        self._submit_lock = threading.Lock()
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._closed = False
        # Scheduler-thread state: only `_serve` and the methods it calls touch these.
        self._waiting: collections.deque[Request | WeightUpdate] = collections.deque()
        self._rows: list[Request] = []
        self._batch: KVBatch | None = None
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
                generator=torch.Generator().manual_seed(seed),
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
        block = not self._rows and not self._waiting
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
        if self._waiting and isinstance(self._waiting[0], WeightUpdate) and not self._rows:
            self._apply_update(self._waiting.popleft())
            return
        admitted = self._admit()
        if admitted:
            self._prefill(admitted)
        if self._rows:
            self._decode()

    def _admit(self) -> list[Request]:
        """Take waiting requests in order, up to free rows and the prefill token budget."""
        admitted: list[Request] = []
        width = 0
        while self._waiting and isinstance(self._waiting[0], Request):
            if len(self._rows) + len(admitted) >= self.max_batch_size:
                break
            new_width = max(width, len(self._waiting[0].prompt_ids))
            if admitted and new_width * (len(admitted) + 1) > self.max_prefill_tokens:
                break
            admitted.append(self._waiting.popleft())
            width = new_width
        return admitted

    def _prefill(self, requests: list[Request]) -> None:
        for request in requests:
            request.policy_version = self.policy_version
        self._rows.extend(requests)  # from here on a failure fails these rows too
        inputs = PrefillInputs.left_pad([r.prompt_ids for r in requests], self.device)
        cache = DynamicCache()
        logits = self._forward(
            input_ids=inputs.input_ids,
            attention_mask=inputs.attention_mask,
            position_ids=inputs.position_ids,
            past_key_values=cache,
        )
        sampled_ids = self._sample(logits, requests)
        joined = KVBatch.after_prefill(cache, inputs, sampled_ids)
        self._batch = joined if self._batch is None else KVBatch.concat(self._batch, joined)
        self._record(StepKind.PREFILL, requests, num_tokens=inputs.input_ids.numel())
        self._retire_rows()

    def _decode(self) -> None:
        assert self._batch is not None and self._batch.num_rows == len(self._rows)
        logits = self._forward(**self._batch.next_step_inputs())
        self._batch.advance(self._sample(logits, self._rows))
        self._record(StepKind.DECODE, self._rows, num_tokens=len(self._rows))
        self._retire_rows()

    def _forward(self, **inputs: Any) -> torch.Tensor:
        """Logits of each row's last position: [num_rows, vocab]."""
        with attention_backends(self.device):
            output = self.model(**inputs, use_cache=True, logits_to_keep=1)
        return output.logits[:, -1, :]

    def _sample(self, logits: torch.Tensor, requests: list[Request]) -> torch.Tensor:
        rows = RowSampling.build([r.sampling for r in requests], [r.generator for r in requests], self.device)
        token_ids, logprobs = sample_next_tokens(logits, rows)
        for request, token_id, logprob in zip(requests, token_ids.tolist(), logprobs.tolist(), strict=True):
            request.append(token_id, logprob)
        self.stats.num_generated_tokens += len(requests)
        return token_ids

    def _retire_rows(self) -> None:
        """Answer finished rows and drop them, with cancelled ones, from the batch."""
        keep = [i for i, r in enumerate(self._rows) if r.finish_reason is None and not r.cancelled]
        if len(keep) == len(self._rows):
            return
        for request in self._rows:
            if request.finish_reason is not None:
                resolve_future(request.future, result=request.generation())
        self._rows = [self._rows[i] for i in keep]
        if not keep:
            self._batch = None
        elif self._batch is not None:
            self._batch = self._batch.select(torch.tensor(keep, device=self.device))

    def _record(self, kind: StepKind, requests: list[Request], num_tokens: int) -> None:
        if kind is StepKind.PREFILL:
            self.stats.num_prefill_steps += 1
        else:
            self.stats.num_decode_steps += 1
        if self._on_step is not None:
            self._on_step(StepRecord(kind, tuple(r.request_id for r in requests), num_tokens))

    def _apply_update(self, update: WeightUpdate) -> None:
        try:
            with torch.no_grad():
                self.model.load_state_dict(update.state_dict, strict=False)
            self.policy_version = update.version
        except Exception as error:  # noqa: BLE001 - the caller of update_weights gets it
            resolve_future(update.future, error=error)
        else:
            resolve_future(update.future, result=None)

    def _fail_rows(self, error: BaseException) -> None:
        for request in self._rows:
            resolve_future(request.future, error=error)
        self._rows = []
        self._batch = None


def resolve_future(future: asyncio.Future, *, result: Any = None, error: BaseException | None = None) -> None:
    """Complete a caller's future from the scheduler thread, on the caller's own loop."""

    def settle() -> None:
        if future.done():  # the caller was cancelled meanwhile
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    try:
        future.get_loop().call_soon_threadsafe(settle)
    except RuntimeError:  # the caller's loop is closed: nobody is waiting any more
        pass
