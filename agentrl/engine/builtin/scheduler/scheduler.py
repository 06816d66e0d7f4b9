"""Inference stage: the built-in engine's scheduler thread, which alone touches the model.

Each iteration drops cancelled requests, applies a weight update once no row runs on the old
weights, prefills admitted requests (`admission` decides which, within the row and token
budgets) and runs one decode step for every running row. Row i owns slot i of the runner's
slot storage: a row leaves once it is finished, or once the passes launched sample its last
allowed token, and is answered once its last token is read (`pending_step`); the last rows move
into the holes.
Anything a forward pass raises fails the rows it touched; the thread keeps serving.
"""

from __future__ import annotations

import collections
import queue
import time
from collections.abc import Callable
from typing import Any

import torch

from agentrl.engine.builtin.cache.prefix_cache import PrefixCache, PrefixMatch
from agentrl.engine.builtin.runner.model_runner import ModelRunner
from agentrl.engine.builtin.runner.sampling import RowSampling, draw_uniforms
from agentrl.engine.builtin.runner.step_inputs import PrefillRows
from agentrl.engine.builtin.scheduler.admission import admit
from agentrl.engine.builtin.scheduler.pending_step import PendingStep, sample_sources
from agentrl.engine.builtin.scheduler.prefix_sharing import SharedPrefixes, slot_nodes
from agentrl.engine.builtin.scheduler.records import EngineStats, StepKind, StepRecord, WeightUpdate
from agentrl.engine.builtin.scheduler.request import Request, resolve_future

SHUTDOWN = object()  # put in the inbox: the scheduler fails what is left and returns


class Scheduler:
    """Continuous batching over one `ModelRunner`: `serve` runs on the engine's thread.

    `inbox` carries `Request`s and `WeightUpdate`s in submission order, then `SHUTDOWN`.
    `parameters`: the model's tensors by state-dict name, which weight updates copy into.
    """

    def __init__(
        self,
        runner: ModelRunner,
        prefix_cache: PrefixCache | None,
        stats: EngineStats,
        inbox: queue.SimpleQueue[Any],
        parameters: dict[str, torch.Tensor],
        *,
        max_batch_size: int,
        max_prefill_tokens: int,
        prefill_interval: int,
        policy_version: int,
        on_step: Callable[[StepRecord], None] | None,
        decode_lookahead: int,
    ) -> None:
        self.runner = runner
        self.prefix_cache = prefix_cache
        # Rows whose slots start with the same cached blocks: decode reads those from one slot.
        self._shared = None if prefix_cache is None else SharedPrefixes(prefix_cache.block_size)
        self.stats = stats
        self._inbox = inbox
        self._parameters = parameters
        self.max_batch_size = max_batch_size
        self.max_prefill_tokens = max_prefill_tokens
        self.prefill_interval = prefill_interval
        self.policy_version = policy_version
        self._on_step = on_step
        self.decode_lookahead = decode_lookahead
        self._decodes_since_prefill = 0
        self._pending: list[PendingStep] = []  # launched passes whose tokens are unread, in launch order
        self._waiting: collections.deque[Request | WeightUpdate] = collections.deque()
        self._rows: list[Request] = []  # row i owns slot i of self.runner.slots
        self._draining: list[Request] = []  # out of the batch, their last tokens in launched passes

    def serve(self) -> None:
        """Schedule until `SHUTDOWN`; then fail the running rows and the waiting requests and updates."""
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
        block = not self._rows and not self._waiting and not self._pending
        while True:
            try:
                command = self._inbox.get(block=block)
            except queue.Empty:
                return True
            if command is SHUTDOWN:
                return False
            self._waiting.append(command)
            block = False

    def _iterate(self) -> None:
        """One scheduling iteration: drop cancelled, apply a due update, prefill, decode."""
        self._waiting = collections.deque(item for item in self._waiting if not item.cancelled)
        self._retire_rows()
        if not self._rows:
            self._read_pending()  # only finished or cancelled rows' tokens are left in it
        if self._waiting and isinstance(self._waiting[0], WeightUpdate) and not self._rows:
            self._apply_update(self._waiting.popleft())
            return
        due = not self._rows or self._decodes_since_prefill >= self.prefill_interval
        budget = self.max_prefill_tokens if due else 0
        first_pass = True
        while budget > 0 and (admitted := self._admit(budget, first_pass)):
            budget -= self._prefill(admitted)
            first_pass = False
        self._retire_rows()  # rows whose one token the prefill pass samples
        if self._rows:
            self._decode()

    def _admit(self, budget: int, first_pass: bool) -> list[Request]:
        num_free_rows = self.max_batch_size - len(self._rows)
        return admit(self._waiting, num_free_rows=num_free_rows, budget=budget, first_pass=first_pass,
                     prefix_cache=self.prefix_cache, packed=self.runner.packed_prefill)  # fmt: skip

    def _prefill(self, requests: list[Request]) -> int:
        """One prefill pass over `requests`; returns the tokens it computed (padding too, unless packed).

        A request that would feed a token outside the vocabulary fails alone, before the pass.
        """
        matches = self._lookup_prefixes(requests)
        rows = self._prefill_rows(requests, matches)
        invalid = rows.out_of_vocabulary(self.runner.vocab_size)
        if invalid:
            requests, matches = self._fail_invalid(requests, matches, invalid)
            if not requests:
                return 0
            rows = self._prefill_rows(requests, matches)
        self._decodes_since_prefill = 0
        for request in requests:
            request.policy_version = self.policy_version
        self._rows.extend(requests)  # from here on a failure fails these rows too
        self.runner.grow_slots(max(len(r.prompt_ids) for r in requests))
        if self.prefix_cache is not None:
            self.prefix_cache.copy_into_slots(
                [(match, rows.first_slot + i) for i, match in enumerate(matches)]
            )
        logits = self.runner.prefill(rows)
        self._pending.append(self._sample_prefill(logits, requests, rows.first_slot))
        for request in requests:
            request.cache_length = len(request.prompt_ids)
        if self.prefix_cache is not None:
            paths = self.prefix_cache.insert_from_slots(
                [(r.prompt_ids, rows.first_slot + i) for i, r in enumerate(requests)]
            )
            block_size = self.prefix_cache.block_size
            for request, match, cached, path in zip(
                requests, matches, rows.first_positions, paths, strict=True
            ):
                self._shared.join(request, slot_nodes(match.node_ids[: cached // block_size], path))
        self.stats.num_prompt_tokens += sum(len(r.prompt_ids) for r in requests)
        self.stats.num_prefix_cached_tokens += int(rows.first_positions.sum())
        computed = rows.num_tokens if self.runner.packed_prefill else rows.num_rows * int(rows.counts.max())
        self._record(StepKind.PREFILL, requests, num_tokens=computed)
        # No row is retired (and no row moves) before this iteration's last prefill pass: a moved
        # row would look for its unread first token where the next pass writes its own.
        return computed

    def _lookup_prefixes(self, requests: list[Request]) -> list[PrefixMatch | None]:
        """Each prompt's longest cached start (None without a prefix cache)."""
        if self.prefix_cache is None:
            return [None] * len(requests)
        return [self.prefix_cache.lookup(r.prompt_ids) for r in requests]

    def _prefill_rows(self, requests: list[Request], matches: list[PrefixMatch | None]) -> PrefillRows:
        """What a pass over `requests` feeds after the cached starts `matches`, in the slots after the running rows."""
        # The last prompt token is always fed: its logits give the first completion token.
        cached = [
            0 if match is None else min(match.num_tokens, len(r.prompt_ids) - 1)
            for r, match in zip(requests, matches, strict=True)
        ]
        return PrefillRows.of([r.prompt_ids for r in requests], cached, first_slot=len(self._rows))

    def _fail_invalid(
        self, requests: list[Request], matches: list[PrefixMatch | None], invalid: dict[int, int]
    ) -> tuple[list[Request], list[PrefixMatch | None]]:
        """Fail the requests at the `invalid` rows ({row: token id}); returns the others and their matches."""
        for row, token_id in invalid.items():
            message = f"prompt token id {token_id} is outside the vocabulary [0, {self.runner.vocab_size})"
            resolve_future(requests[row].future, error=ValueError(message))
        kept = [row for row in range(len(requests)) if row not in invalid]
        return [requests[row] for row in kept], [matches[row] for row in kept]

    def _decode(self) -> None:
        """Launch a decode step for every running row; then read the passes launched before the
        decode step `decode_lookahead` steps back (with 0, this one too).

        The host reads step N's tokens (and those of the prefill passes launched before it) while
        the device runs steps N+1..N+lookahead, which were launched before the host knew which rows
        a stop token in step N finished: such a row computes a token in each of them, dropped (the
        key/value the first of them stores, its last kept token's, is valid). A row whose token
        budget ends at step N is known at its launch and leaves the batch then (`_retire_rows`).
        A prefill pass launched between steps N and N+1 is read after step N+1+lookahead is
        launched, so the host prepares the next passes while the device computes them.
        """
        self._pending.append(self._launch_decode())
        decodes = [index for index, step in enumerate(self._pending) if step.decode]
        done = decodes[-1 - self.decode_lookahead] + 1 if len(decodes) > self.decode_lookahead else 0
        self._finish(self._pending[:done])  # also retires the rows whose last token this step samples
        del self._pending[:done]

    def _launch_decode(self) -> PendingStep:
        requests = list(self._rows)
        positions = [r.cache_length for r in requests]
        self.runner.grow_slots(max(positions) + 1)
        # A row whose last token the host has not read continues from its sample, still on the device.
        sources = sample_sources(requests, self._pending)
        host_ids = [
            0 if source >= 0 else r.completion_ids[-1] for r, source in zip(requests, sources, strict=True)
        ]
        params = [r.sampling for r in requests]
        uniforms = draw_uniforms(params, [r.generator for r in requests])
        shares = None if self._shared is None else self._shared.sources(requests)
        picked = self.runner.decode(
            self.runner.stage_decode(positions, sources, host_ids, params, uniforms, shares)
        )
        for request in requests:
            request.cache_length += 1
        self._decodes_since_prefill += 1
        return PendingStep.launch(requests, picked, first_sample=0, decode=True, device=self.runner.device)

    def _finish(self, steps: list[PendingStep]) -> None:
        """Append launched passes' tokens (in launch order) to the rows each did not find finished;
        then answer finished rows and retire them from the batch."""
        for step in steps:
            live = []  # rows finished by an earlier pass (or cancelled since the launch) keep no token
            for request, token_id, logprob in zip(step.requests, *step.read(), strict=True):
                if request.finish_reason is None and not request.cancelled:
                    request.append(int(token_id), logprob)
                    live.append(request)
            self.stats.num_generated_tokens += len(live)
            if live and step.decode:
                self._record(StepKind.DECODE, live, num_tokens=len(step.requests))
        self._answer_drained()
        self._retire_rows()

    def _read_pending(self) -> None:
        """Finish every launched pass (before updating weights or idling)."""
        pending, self._pending = self._pending, []
        self._finish(pending)

    def _sample_prefill(self, logits: torch.Tensor, requests: list[Request], first_slot: int) -> PendingStep:
        sampling = RowSampling.build(
            [r.sampling for r in requests], [r.generator for r in requests], self.runner.device
        )
        picked, first_sample = self.runner.sample_prefill(logits, sampling, first_slot)
        return PendingStep.launch(requests, picked, first_sample, decode=False, device=self.runner.device)

    def _retire_rows(self) -> None:
        """Drop finished and cancelled rows, and rows whose last token is on its way, from the batch;
        the last rows fill their slots.

        A finished row is answered. A row whose passes in flight sample its last allowed token
        (`Request.budget_launched`) needs no further step: it leaves now, so that no step computes
        a token of it to drop, and is answered once those tokens are read (`_answer_drained`).
        Each row leaving unfinished or finished gives the prefix cache the keys/values of its
        tokens read so far.
        """
        done = [
            i
            for i, r in enumerate(self._rows)
            if r.finish_reason is not None or r.cancelled or r.budget_launched
        ]
        if not done:
            return
        leaving = [(slot, self._rows[slot]) for slot in done if not self._rows[slot].cancelled]
        if self._shared is not None:
            for slot in done:
                self._shared.leave(self._rows[slot])
        if self.prefix_cache is not None:
            self.prefix_cache.insert_from_slots([(r.cached_token_ids(), slot) for slot, r in leaving])
        for _, request in leaving:
            if request.finish_reason is not None:
                resolve_future(request.future, result=request.generation())
            else:
                self._draining.append(request)
        num_kept = len(self._rows) - len(done)
        done_set = set(done)
        holes = [slot for slot in done if slot < num_kept]
        movers = [slot for slot in range(num_kept, len(self._rows)) if slot not in done_set]
        self.runner.slots.move_slots(movers, holes, [self._rows[slot].cache_length for slot in movers])
        for hole, mover in zip(holes, movers, strict=True):
            self._rows[hole] = self._rows[mover]
        del self._rows[num_kept:]

    def _answer_drained(self) -> None:
        """Answer the rows out of the batch whose last token has been read; forget cancelled ones."""
        waiting = []
        for request in self._draining:
            if request.finish_reason is not None:
                resolve_future(request.future, result=request.generation())
            elif not request.cancelled:
                waiting.append(request)
        self._draining = waiting

    def _wait_for_pending(self) -> None:
        """Wait for the passes launched and not read: a step still queued on the device reads its
        staged block and writes its pick buffer entry (`decode_graphs`), which the next steps reuse."""
        for step in self._pending:
            try:
                step.wait()
            except Exception:  # noqa: BLE001 - a device that failed fails the later passes too
                return

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
            if self.runner.device.type == "cuda":
                torch.cuda.synchronize(self.runner.device)  # the caller may reuse its tensors once we answer
            self.stats.weight_sync_seconds = time.perf_counter() - start
            self.policy_version = update.version
        except Exception as error:  # noqa: BLE001 - the caller of update_weights gets it
            resolve_future(update.future, error=error)
        else:
            resolve_future(update.future, result=None)

    def _fail_rows(self, error: BaseException) -> None:
        self._wait_for_pending()
        self._pending = []  # their unfinished rows are among self._rows and self._draining
        for request in self._rows + self._draining:
            resolve_future(request.future, error=error)
        self._rows, self._draining = [], []
        if self._shared is not None:
            self._shared.clear()
