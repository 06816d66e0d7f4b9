"""The Ray actors of `trainer.launcher=ray`: a policy worker (one rank of the run) and an engine server."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING

import ray

from agentrl.config import Config
from agentrl.engine.config import EngineConfig

if TYPE_CHECKING:
    from agentrl.engine.remote.balanced_client import BalancedEngine


@ray.remote
class PolicyWorkerActor:
    """One data-parallel rank: the same `build_trainer(config, run_dir).fit()` a torchrun rank runs."""

    def rendezvous_address(self) -> tuple[str, int]:
        """This node's address and a port free on it, for rank 0 to host the process group's store."""
        with socket.socket() as probe:
            probe.bind(("", 0))
            port = probe.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def build(
        self,
        config: Config,
        run_dir: Path,
        *,
        rank: int,
        world_size: int,
        master_address: str,
        master_port: int,
        engine_urls: list[str],
        api_key: str,
    ) -> None:
        """Join the process group as `rank` and build its trainer; with `engine_urls`, one that
        generates through those servers."""
        # Ray gives each actor only its own GPUs (CUDA_VISIBLE_DEVICES), so its device is always local index 0.
        os.environ.update(
            RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
            MASTER_ADDR=master_address, MASTER_PORT=str(master_port),
        )  # fmt: skip
        from agentrl.trainer.components import build_trainer

        if not engine_urls:  # colocated: the engine section builds this worker's own engine
            self.trainer = build_trainer(config, run_dir)
        else:  # split: one client over every engine server
            engine = balanced_engine(config, run_dir, engine_urls, api_key, rank=rank)
            self.trainer = build_trainer(config, run_dir, engine=engine)

    def fit(self) -> None:
        """Train with the trainer `build` made."""
        asyncio.run(self.trainer.fit())


def balanced_engine(
    config: Config, run_dir: Path, engine_urls: list[str], api_key: str, *, rank: int
) -> BalancedEngine:
    """Rank `rank`'s client of every engine server; rank 0 is the one that loads new weights."""
    from agentrl.engine.remote.balanced_client import BalancedEngine
    from agentrl.engine.remote.sglang_client import SGLangEngine
    from agentrl.engine.remote.weight_sender import DistributedSyncSettings
    from agentrl.model_path import resolve_model_path

    model_path = resolve_model_path(config.model.path)
    defaults = EngineConfig(backend="sglang", url=engine_urls[0])
    servers = [
        SGLangEngine(
            url,
            model_path=model_path,
            dtype=config.model.dtype,
            request_timeout_s=defaults.request_timeout_s,
            max_retries=defaults.max_retries,
            max_connections=defaults.max_connections,
            api_key=api_key,
        )
        for url in engine_urls
    ]
    return BalancedEngine(
        servers,
        model_path=model_path,
        updates_weights=rank == 0,
        dtype=config.model.dtype,  # what the engine servers load into
        weights_dir=run_dir / "weight_sync",
        version_timeout_s=defaults.request_timeout_s,
        distributed_sync=DistributedSyncSettings.from_config(config.engine),
    )


@ray.remote
class EngineServer:
    """The built-in engine behind SGLang's native HTTP protocol, on this actor's node and devices.

    An async actor: the HTTP server runs on the actor's own event loop between calls.
    """

    async def start(self, config: Config, api_key: str) -> str:
        """Load the policy the run starts from and serve it; the URL workers reach it at."""
        from aiohttp import web

        from agentrl.engine.factory import build_engine
        from agentrl.engine.serve.http_server import ServedEngine, build_app
        from agentrl.engine.serve.weight_receiver import add_weight_transfer_routes
        from agentrl.model_path import load_tokenizer, resolve_model_path
        from agentrl.trainer.components import DTYPES

        model_path, dtype = resolve_model_path(config.model.path), DTYPES[config.model.dtype]
        self.engine = build_engine(config.model, config.engine, seed=config.trainer.seed)
        served = ServedEngine(self.engine, load_tokenizer(model_path), model_path, dtype, api_key=api_key)
        app = build_app(served)
        add_weight_transfer_routes(app)  # engine.weight_sync=distributed
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        host = ray.util.get_node_ip_address()  # reachable from workers on other nodes
        site = web.TCPSite(self.runner, host, 0)
        await site.start()
        port = self.runner.addresses[0][1]
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
