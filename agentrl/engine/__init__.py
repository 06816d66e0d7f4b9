"""Inference stage: token-in/token-out generation behind one async protocol.

    protocol.py     the contract every engine meets: `generate(prompt_ids, sampling) -> Generation`
    config.py       the `model` and `engine` config sections (`ModelConfig`, `EngineConfig`)
    factory.py      `build_engine`: where every entry point builds its engine, from those two sections
    builtin/        the built-in engine, a transformers model behind continuous batching
      engine.py       `TransformersEngine`: what callers touch (generate, update_weights, close)
      scheduler/      the scheduler thread: which requests run, their rows, their answers
      runner/         how a pass runs on the device: its inputs, CUDA graphs, sampling
      model/          the forward pass: the fused decoder on CUDA, else transformers' modules
      kernels/        the fused forward's Triton kernels (CUDA only)
      cache/          keys and values: one slot per batch row, and the prefix cache
    remote/         a client of an SGLang-protocol server (and its launcher, wire format, load balancer)
    serve/          the built-in engine over HTTP: `python -m agentrl.engine.serve`

Read this first, one `generate()` of the built-in engine in the order it runs:

1. `factory.build_engine` loads the model and starts `TransformersEngine` (`builtin/engine.py`)
   with the `engine` section; its scheduler thread owns the model from then on.
2. `TransformersEngine.generate` checks the prompt and sampling settings, wraps them in a
   `Request` (`builtin/scheduler/request.py`) and queues it; the caller awaits its future.
3. The scheduler (`builtin/scheduler/scheduler.py`, `Scheduler._iterate`) takes it, and admission
   (`admission.py`) puts it in the next prefill pass within the row and token budgets. The prefix
   cache (`builtin/cache/prefix_cache.py`) copies the keys/values of the prompt's already-seen
   start into the request's slot (`builtin/cache/slot_cache.py`).
4. `ModelRunner.prefill` (`builtin/runner/model_runner.py`) feeds the rest of the prompt
   (`step_inputs.py`, packed for the fused forward by `packed_prefill.py`) through the model:
   `builtin/model/fused_decoder.py` and its `builtin/kernels/` on CUDA, else transformers' modules
   with `builtin/model/slot_attention.py`. The first token is sampled (`builtin/runner/sampling.py`).
5. Every iteration then runs one decode step for all running rows: its inputs staged in one block
   (`decode_batch.py`), replayed as a CUDA graph on CUDA (`decode_graphs.py`), its tokens read a
   few steps later (`builtin/scheduler/pending_step.py`) and appended to the request.
6. At a stop token or the token budget the scheduler retires the row and resolves the future with
   the `Generation` (`protocol.py`); `generate` returns it.

The names below load lazily, so that `agentrl.engine.config` (imported by the config schema)
pulls in no torch or transformers.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "BalancedEngine": "remote.balanced_client",
    "EngineConfig": "config",
    "EngineRequestError": "remote.sglang_protocol",
    "EngineStats": "builtin.scheduler.records",
    "FinishReason": "protocol",
    "Generation": "protocol",
    "InferenceEngine": "protocol",
    "ModelConfig": "config",
    "SamplingParams": "protocol",
    "SGLangEngine": "remote.sglang_client",
    "StepKind": "builtin.scheduler.records",
    "StepRecord": "builtin.scheduler.records",
    "TransformersEngine": "builtin.engine",
    "build_engine": "factory",
}

__all__ = [
    "BalancedEngine",
    "EngineConfig",
    "EngineRequestError",
    "EngineStats",
    "FinishReason",
    "Generation",
    "InferenceEngine",
    "ModelConfig",
    "SGLangEngine",
    "SamplingParams",
    "StepKind",
    "StepRecord",
    "TransformersEngine",
    "build_engine",
]


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'agentrl.engine' has no attribute {name!r}")
    return getattr(importlib.import_module(f"agentrl.engine.{_HOMES[name]}"), name)
