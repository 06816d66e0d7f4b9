"""`trainer.launcher=ray`: place the policy workers (and, split, the engines) as Ray actors.

There is no second training loop. Each policy worker actor is one rank of the FSDP2 group
(gloo on CPU, NCCL on GPU): it sets the rendezvous variables torchrun would set (RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK) and runs `build_trainer(config, run_dir).fit()`,
so it rolls out its share of each step's groups and rank 0 writes metrics and checkpoints.

- `ray.placement=colocated`: every worker builds the engine of the `engine` section in its own
  process, on its own GPU, as under torchrun.
- `ray.placement=split`: `ray.num_engines` engine actors each serve the built-in engine over
  SGLang's native HTTP protocol (the app of `python -m agentrl.engine.serve`), and every worker
  generates through one `BalancedEngine` of all of them. Weights reach the servers as a Hugging
  Face export under `<run_dir>/weight_sync`, which is why the run dir must be on a filesystem
  every node can read when the cluster has several machines.

All actors are reserved at once in one placement group, rather than starting half of the ranks
and hanging in the first collective. CPUs left unset are shared out: one per actor, or an even
fraction of the cluster's CPUs when it has fewer (two workers and an engine on two cores get 0.6666
each; Ray's CPUs are bookkeeping, not pinning). A cluster that cannot hold the actors even when
idle fails at once, naming the settings to lower; one that is only busy is waited for, up to
`ray.startup_timeout_s`. If any worker fails, the others are stopped at once for the same reason.
"""

from __future__ import annotations

import math
import secrets
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayTaskError
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from agentrl.config import Config
from agentrl.engine.remote.sglang_protocol import EngineRequestError
from agentrl.launchers.actors import EngineServer, PolicyWorkerActor
from agentrl.trainer.health import RunStopped


@dataclass(frozen=True)
class Placement:
    """The Ray resources of one run: one bundle per policy worker, then one per engine actor."""

    worker_bundle: dict[str, float]
    engine_bundle: dict[str, float]
    num_workers: int
    num_engines: int  # 0 when colocated

    @property
    def bundles(self) -> list[dict[str, float]]:
        return [self.worker_bundle] * self.num_workers + [self.engine_bundle] * self.num_engines


RAY_RESOURCE_PRECISION = 10_000  # Ray accounts fractional resources in steps of 1/10000


def plan_placement(config: Config, cluster_has_gpus: bool, cluster_cpus: float) -> Placement:
    """Resources per actor from the `ray` section. An unset GPU count means 1 on a GPU cluster,
    else 0; an unset CPU count means 1, or an even share of `cluster_cpus` when that is less
    than one per actor."""
    settings = config.ray
    split = settings.placement == "split"
    num_engines = settings.num_engines if split else 0
    num_actors = settings.num_workers + num_engines
    share = min(1.0, math.floor(cluster_cpus / num_actors * RAY_RESOURCE_PRECISION) / RAY_RESOURCE_PRECISION)

    def bundle(num_cpus: float | None, num_gpus: float | None) -> dict[str, float]:
        gpus = (1.0 if cluster_has_gpus else 0.0) if num_gpus is None else num_gpus
        cpus = share if num_cpus is None else num_cpus
        return {"CPU": cpus, **({"GPU": gpus} if gpus else {})}

    return Placement(
        worker_bundle=bundle(settings.num_cpus_per_worker, settings.num_gpus_per_worker),
        engine_bundle=bundle(settings.num_cpus_per_engine, settings.num_gpus_per_engine),
        num_workers=settings.num_workers,
        num_engines=num_engines,
    )


def check_fits(placement: Placement, nodes: list[dict[str, float]]) -> None:
    """ValueError, at once, when the cluster's `nodes` (each one's total resources) cannot hold the
    placement even when idle: in all, or one actor on any single node. Waiting would not help."""
    totals: dict[str, float] = {}
    for node in nodes:
        for name, amount in node.items():
            totals[name] = totals.get(name, 0.0) + amount
    for name in ("CPU", "GPU"):
        asked = sum(bundle.get(name, 0.0) for bundle in placement.bundles)
        largest_bundle = max((bundle.get(name, 0.0) for bundle in placement.bundles), default=0.0)
        largest_node = max((node.get(name, 0.0) for node in nodes), default=0.0)
        if asked > totals.get(name, 0.0) + 1e-9 or largest_bundle > largest_node + 1e-9:
            knobs = (
                "ray.num_cpus_per_worker, ray.num_cpus_per_engine"
                if name == "CPU"
                else ("ray.num_gpus_per_worker, ray.num_gpus_per_engine")
            )
            raise ValueError(
                f"the Ray cluster cannot hold {placement.num_workers} policy workers of {placement.worker_bundle}"
                f" and {placement.num_engines} engines of {placement.engine_bundle}: that is {asked:g} {name} "
                f"(at most {largest_bundle:g} per actor), and it has {totals.get(name, 0.0):g} {name} "
                f"(at most {largest_node:g} on one node). Lower ray.num_workers, ray.num_engines or {knobs} "
                f"(unset CPU counts share the cluster's CPUs out), or add nodes"
            )


def check_launchable(config: Config) -> None:
    """Settings that only conflict once the launcher is ray; ValueError names the fix."""
    if config.ray.placement == "split" and config.engine.backend != "transformers":
        raise ValueError(
            f"ray.placement=split starts built-in engine servers, but engine.backend={config.engine.backend}; "
            "use ray.placement=colocated to attach every worker to engine.url, or the built-in engine"
        )


def run_with_ray(config: Config, run_dir: Path) -> int:
    """Train with Ray actors; the exit status `python -m agentrl.train` returns (0, 1 stopped, 2 user error)."""
    try:
        check_launchable(config)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init(address=config.ray.address, include_dashboard=False)
    try:
        _fit_on_actors(config, run_dir.resolve())
    except RunStopped as stopped:
        print(f"error: {stopped}", file=sys.stderr)
        return 1
    except (ValueError, EngineRequestError) as error:  # bad data files, a cluster too small
        print(f"error: {error}", file=sys.stderr)
        return 2
    finally:
        if started_ray:
            ray.shutdown()
    return 0


def _fit_on_actors(config: Config, run_dir: Path) -> None:
    cluster = ray.cluster_resources()
    placement = plan_placement(config, cluster.get("GPU", 0) > 0, cluster.get("CPU", 0.0))
    check_fits(placement, [node["Resources"] for node in ray.nodes() if node["Alive"]])
    group = placement_group(placement.bundles, strategy="PACK")
    actors: list[Any] = []
    try:
        _wait_for_resources(group, placement, config.ray.startup_timeout_s)

        def on_bundle(index: int) -> PlacementGroupSchedulingStrategy:
            return PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index)

        engines = [
            EngineServer.options(
                num_cpus=placement.engine_bundle["CPU"],
                num_gpus=placement.engine_bundle.get("GPU", 0),
                scheduling_strategy=on_bundle(placement.num_workers + index),
            ).remote()
            for index in range(placement.num_engines)
        ]
        workers = [
            PolicyWorkerActor.options(
                num_cpus=placement.worker_bundle["CPU"],
                num_gpus=placement.worker_bundle.get("GPU", 0),
                scheduling_strategy=on_bundle(rank),
            ).remote()
            for rank in range(placement.num_workers)
        ]
        actors = [*engines, *workers]
        api_key = secrets.token_urlsafe(24)  # the servers listen off loopback: only this run may load weights
        engine_urls = _get(
            [engine.start.remote(config, api_key) for engine in engines], config.ray.startup_timeout_s
        )
        master_address, master_port = _get([workers[0].rendezvous_address.remote()], None)[0]
        _get(
            [
                worker.build.remote(
                    config,
                    run_dir,
                    rank=rank,
                    world_size=len(workers),
                    master_address=master_address,
                    master_port=master_port,
                    engine_urls=engine_urls,
                    api_key=api_key,
                )
                for rank, worker in enumerate(workers)
            ],
            None,
        )
        _get([worker.fit.remote() for worker in workers], None)
    finally:
        for actor in actors:
            ray.kill(actor)
        remove_placement_group(group)
        shutil.rmtree(run_dir / "weight_sync", ignore_errors=True)


def _wait_for_resources(group: PlacementGroup, placement: Placement, timeout_s: float) -> None:
    try:
        ray.get(group.ready(), timeout=timeout_s)
    except GetTimeoutError:
        raise ValueError(
            f"the Ray cluster could not hold {placement.num_workers} policy workers of {placement.worker_bundle} "
            f"and {placement.num_engines} engines of {placement.engine_bundle} within ray.startup_timeout_s="
            f"{timeout_s}: it has {ray.cluster_resources()}, of which {ray.available_resources()} are free "
            "(other jobs hold the rest). Wait for them, raise ray.startup_timeout_s, lower ray.num_workers "
            "or the per-actor resources (ray.num_cpus_per_worker, ...), or add nodes"
        ) from None


def _get(futures: list[Any], timeout_s: float | None) -> list[Any]:
    """Results in order; the first failure is raised at once, without waiting for the rest.

    Ranks wait for each other in collectives, so one failed rank would leave the others blocked
    forever: the caller's `finally` kills them as soon as this raises.
    """
    pending = list(futures)
    while pending:
        done, pending = ray.wait(pending, num_returns=1, timeout=timeout_s)
        if not done:
            raise ValueError(f"Ray actors did not answer within ray.startup_timeout_s={timeout_s}")
        try:
            ray.get(done[0])
        except RayTaskError as error:
            if isinstance(error.cause, (ValueError, EngineRequestError, RunStopped)):
                raise error.cause from None  # a user error or a stopped run reads as in one process
            raise
    return ray.get(futures)
