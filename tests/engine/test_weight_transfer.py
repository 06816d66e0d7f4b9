"""Disk-free weight sync: the trainer broadcasts weights over gloo to a real `python -m agentrl.engine.serve`.

The server runs in a process of its own, as in split placement; this test process is the trainer
(rank 0 of the weights-update group).
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator

import pytest
import torch
from pydantic import ValidationError

from agentrl.config_loader import ConfigError, load_config
from agentrl.engine.config import EngineConfig
from agentrl.engine.protocol import SamplingParams
from agentrl.engine.remote.sglang_client import SGLangEngine
from agentrl.engine.remote.sglang_protocol import WireUpdateWeightsFromDistributed
from agentrl.engine.remote.weight_sender import DistributedSyncSettings
from agentrl.engine.remote.weight_transfer import WeightSyncTimeout, flatten, plan_buckets, unflatten
from agentrl.model_path import load_causal_lm
from agentrl.tiny_policy import DEFAULT_MODEL_PATH
from tests.engine.served import start_served_engine, stop_served_engine

MODEL = str(DEFAULT_MODEL_PATH)
GREEDY = SamplingParams(max_new_tokens=8, temperature=0.0)
PROMPTS = [[1, 2, 3, 4], [5, 6, 7], [10, 11, 12, 13, 14]]


# ---- buckets ----


def test_tied_weights_are_sent_once_and_buckets_stay_under_the_limit() -> None:
    shared = torch.ones(4, 4)
    state_dict = {
        "embed": shared,
        "head": shared,
        "a": torch.zeros(3),
        "b": torch.zeros(12),
        "c": torch.zeros(2),
    }
    buckets = plan_buckets(state_dict, bucket_bytes=64)
    assert [[spec.name for spec in bucket.specs] for bucket, _ in buckets] == [["embed"], ["a", "b"], ["c"]]
    assert [bucket.num_bytes for bucket, _ in buckets] == [64, 60, 8]


def test_a_flattened_bucket_of_mixed_dtypes_comes_back_exactly() -> None:
    state_dict = {
        "half": torch.tensor([1.5, -2.0], dtype=torch.bfloat16),
        "ids": torch.tensor([[7, 8, 9]], dtype=torch.int64),
        "odd": torch.tensor([0.25, 0.5, 0.75], dtype=torch.float32),
    }
    [(bucket, tensors)] = plan_buckets(state_dict, bucket_bytes=1 << 20)
    assert [spec.name for spec in bucket.specs] == [
        "ids",
        "odd",
        "half",
    ]  # falling item size: offsets aligned
    back = unflatten(flatten(tensors), bucket)
    for name, tensor in state_dict.items():
        assert back[name].dtype == tensor.dtype and torch.equal(back[name], tensor)


def test_a_request_needs_one_dtype_and_shape_per_name() -> None:
    with pytest.raises(ValidationError, match="one entry per tensor"):
        WireUpdateWeightsFromDistributed(names=["a", "b"], dtypes=["float32"], shapes=[[1], [2]])


# ---- config ----


def test_distributed_sync_is_refused_for_the_in_process_engine() -> None:
    with pytest.raises(ConfigError, match="engine.weight_sync=distributed broadcasts"):
        load_config(["env=math", "engine.weight_sync=distributed"])


def test_distributed_sync_knobs_are_refused_with_disk_sync() -> None:
    with pytest.raises(
        ValidationError, match="weight_sync_timeout_s is read only with engine.weight_sync=distributed"
    ):
        EngineConfig(backend="sglang", url="http://127.0.0.1:1", weight_sync_timeout_s=5)
    settings = DistributedSyncSettings.from_config(
        EngineConfig(
            backend="sglang", url="http://127.0.0.1:1", weight_sync="distributed", weight_sync_timeout_s=5
        )
    )
    assert settings == DistributedSyncSettings(bucket_bytes=512 << 20, timeout_s=5)


# ---- against a served engine ----


@pytest.fixture
def server_url() -> Iterator[str]:
    process, url = start_served_engine()
    try:
        yield url
    finally:
        stop_served_engine(process)


@pytest.fixture
def stoppable_server() -> Iterator[tuple[subprocess.Popen, str]]:
    process, url = start_served_engine()
    try:
        yield process, url
    finally:
        stop_served_engine(process)


def client(url: str, tmp_path, **sync) -> SGLangEngine:
    settings = DistributedSyncSettings(**sync) if sync else None
    return SGLangEngine(
        url,
        model_path=MODEL,
        request_timeout_s=60,
        max_retries=0,
        weights_dir=tmp_path,
        distributed_sync=settings,
    )


def perturbed_weights(seed: int) -> dict[str, torch.Tensor]:
    """The tiny policy's weights with noise large enough to change greedy completions."""
    generator = torch.Generator().manual_seed(seed)
    state_dict = load_causal_lm(MODEL, dtype="float32").state_dict()
    return {
        name: tensor + 0.05 * torch.randn(tensor.shape, generator=generator)
        for name, tensor in state_dict.items()
    }


async def completions(engine: SGLangEngine) -> list[list[int]]:
    return [(await engine.generate(prompt, GREEDY)).completion_ids for prompt in PROMPTS]


@pytest.mark.slow
async def test_weights_broadcast_over_gloo_serve_what_the_same_weights_loaded_from_disk_serve(
    server_url, tmp_path
):
    disk = client(server_url, tmp_path / "disk")
    # Small buckets: the state dict (about 4 MB) goes in many requests, loaded together at the last.
    distributed = client(server_url, tmp_path / "group", bucket_bytes=256 << 10, timeout_s=60)
    try:
        original = await completions(disk)
        weights = perturbed_weights(seed=1)
        await disk.update_weights(weights, version=1)
        from_disk = await completions(disk)
        assert from_disk != original  # the perturbation changes what greedy decoding picks

        await distributed.update_weights(load_causal_lm(MODEL, dtype="float32").state_dict(), version=2)
        assert await completions(distributed) == original
        assert await distributed.policy_version() == 2
        await distributed.update_weights(weights, version=3)  # the group opened at version 2 is reused
        assert await completions(distributed) == from_disk
        assert await distributed.policy_version() == 3
        assert {(await distributed.generate(PROMPTS[0], GREEDY)).policy_version} == {3}
        assert not (tmp_path / "group").exists()  # nothing went through disk
    finally:
        await disk.close()
        await distributed.close()


@pytest.mark.slow
async def test_a_server_that_never_joins_fails_the_sync_with_a_named_timeout(stoppable_server, tmp_path):
    process, url = stoppable_server
    engine = client(url, tmp_path, bucket_bytes=1 << 20, timeout_s=2.0)
    process.send_signal(signal.SIGSTOP)  # accepts connections (the kernel does) but never answers
    started = time.monotonic()
    try:
        with pytest.raises(
            WeightSyncTimeout, match=r"/init_weights_update_group: 0 bytes not transferred within the 2 s"
        ):
            await engine.update_weights(perturbed_weights(seed=2), version=1)
    finally:
        process.send_signal(signal.SIGCONT)
        await engine.close()
    assert time.monotonic() - started < 30  # bounded by the deadline, not by the peer


@pytest.mark.slow
async def test_a_server_that_hangs_mid_sync_fails_the_bucket_with_a_named_timeout(stoppable_server, tmp_path):
    process, url = stoppable_server
    engine = client(url, tmp_path, bucket_bytes=8 << 20, timeout_s=3.0)
    weights = perturbed_weights(seed=3)
    try:
        await engine.update_weights(weights, version=1)  # the group forms and one sync goes through
        process.send_signal(signal.SIGSTOP)
        num_bytes = sum(tensor.numel() * 4 for tensor in {id(t): t for t in weights.values()}.values())
        with pytest.raises(WeightSyncTimeout) as raised:
            await engine.update_weights(weights, version=2)
        assert raised.value.route == "/update_weights_from_distributed"
        assert raised.value.deadline_s == 3.0
        assert 0 < raised.value.num_bytes <= num_bytes
    finally:
        process.send_signal(signal.SIGCONT)
        await engine.close()
