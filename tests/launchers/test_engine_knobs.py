"""Every path that builds an engine builds it from the whole `engine` section: no knob is dropped on the way.

The paths: the trainer's components (one process, and each torchrun rank, which runs the same
`build_trainer`), a Ray policy worker (colocated placement), a Ray engine server (split
placement), `python -m agentrl.engine.serve`, the debugger and the engine benchmarks.
"""

from __future__ import annotations

import sys
from pathlib import Path

import ray
import torch

from agentrl.config import Config
from agentrl.config_loader import load_config
from agentrl.debug.__main__ import build_setup
from agentrl.engine.config import BUILT_IN_KNOBS, EngineConfig
from agentrl.engine.serve.__main__ import build_served, parse_args
from agentrl.launchers.actors import EngineServer, PolicyWorkerActor
from agentrl.trainer.components import build_trainer

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import engine_throughput

# Every built-in knob, none at its default; all of them work on the CPU.
KNOBS = {
    "device": "cpu", "max_batch_size": 3, "max_prefill_tokens": 100, "prefix_cache_bytes": 1 << 20,
    "prefix_block_size": 4, "cuda_graphs": False, "prefill_interval": 2, "torch_compile": True,
    "fused_forward": False, "decode_lookahead": 1,
}  # fmt: skip
SECTION = [f"engine.{name}={value}" for name, value in KNOBS.items()]
FLAGS = [
    "--device", "cpu", "--max-batch-size", "3", "--max-prefill-tokens", "100",
    "--prefix-cache-bytes", str(1 << 20), "--prefix-block-size", "4", "--no-cuda-graphs",
    "--prefill-interval", "2", "--torch-compile", "--no-fused-forward", "--decode-lookahead", "1",
]  # fmt: skip
# What an engine built with KNOBS runs with: its section, and what it derived from the knobs.
EXPECTED = (EngineConfig(**KNOBS), "cpu", 3, 2, 1, 4)
# A lambda, so that Ray sends it to an actor by value.
facts = lambda engine: (
    engine.config, engine.device.type, engine.max_batch_size, engine.prefill_interval,
    engine.decode_lookahead, engine.prefix_cache.block_size,
)  # fmt: skip


def config_with_knobs() -> Config:
    return load_config(["env=math", "trainer.device=cpu", *SECTION])


def test_the_knobs_cover_the_built_in_engine_and_none_is_at_its_default():
    assert set(KNOBS) == set(BUILT_IN_KNOBS)
    defaults = EngineConfig()
    assert [name for name in KNOBS if getattr(defaults, name) == KNOBS[name]] == []


async def test_the_trainers_engine_gets_every_knob(tmp_path):
    engine = build_trainer(config_with_knobs(), tmp_path).parts.engine
    try:
        assert facts(engine) == EXPECTED
    finally:
        await engine.close()


async def test_the_debuggers_engine_gets_every_knob():
    engine = build_setup(config_with_knobs(), row=0, seed=0).engine
    try:
        assert facts(engine) == EXPECTED
    finally:
        await engine.close()


async def test_the_served_engine_gets_every_knob_from_its_flags():
    served = build_served(parse_args(["--model", "tiny", *FLAGS]))
    try:
        assert facts(served.engine) == EXPECTED
    finally:
        await served.engine.close()


async def test_the_benchmarks_engine_gets_every_knob_from_its_flags(tmp_path):
    args = engine_throughput.parse_args(engine_throughput.build_parser("engine"), ["--model", "tiny", *FLAGS])
    model = engine_throughput.build_model(args.model, args.device, torch.float32)
    checkpoint = engine_throughput.save_checkpoint(model, tmp_path, args.dtype)
    engine = engine_throughput.open_engine(checkpoint, args, prefix_cache=True)
    try:
        assert facts(engine) == EXPECTED
    finally:
        await engine.close()


def test_ray_workers_and_engine_servers_get_every_knob(ray_instance, tmp_path):
    config = config_with_knobs()
    worker, server = PolicyWorkerActor.remote(), EngineServer.remote()
    try:
        # Split placement: an engine server builds the engine that the workers' clients call.
        ray.get(server.start.remote(config, "api-key"), timeout=300)
        assert ray.get(server.__ray_call__.remote(lambda actor: facts(actor.engine))) == EXPECTED
        # Colocated placement: each worker builds its own engine.
        address, port = ray.get(worker.rendezvous_address.remote())
        ray.get(
            worker.build.remote(config, tmp_path, rank=0, world_size=1, master_address=address,
                                master_port=port, engine_urls=[], api_key=""),
            timeout=300,
        )  # fmt: skip
        engine_facts = ray.get(worker.__ray_call__.remote(lambda actor: facts(actor.trainer.parts.engine)))
        assert engine_facts == EXPECTED
    finally:
        ray.kill(worker)
        ray.kill(server)
