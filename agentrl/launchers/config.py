"""Placement settings for `trainer.launcher=ray`: how many policy workers and engines, and where they run."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class RayConfig(BaseModel):
    """Ray actors for one run: `num_workers` policy workers (the FSDP2 group) and, in split
    placement, `num_engines` engine servers.

    `colocated`: each policy worker builds its own rollout engine (from the `engine` section) in
    its own process and on its own GPU, exactly as a torchrun rank does. `split`: the built-in
    engine runs in `num_engines` separate actors, each serving SGLang's native HTTP protocol
    (`python -m agentrl.engine.serve`'s app), and every policy worker generates through one
    load-balancing client of all of them.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    address: str | None = Field(
        None,
        description="Ray cluster to join (e.g. 'auto' or 'ray://head:10001'); None: the running one, "
        "RAY_ADDRESS, or a new local instance",
    )
    num_workers: int = Field(2, gt=0, description="policy workers: the data-parallel (FSDP2) ranks")
    placement: Literal["colocated", "split"] = Field(
        "colocated", description="colocated: an engine inside each worker; split: engine actors of their own"
    )
    num_engines: int = Field(1, gt=0, description="split: engine server actors behind the balanced client")
    num_cpus_per_worker: float | None = Field(
        None,
        gt=0,
        description="CPUs Ray reserves for each policy worker; null: 1, or an even share of the cluster's CPUs "
        "when it has fewer than one per actor",
    )
    num_gpus_per_worker: float | None = Field(
        None, ge=0, description="GPUs per policy worker; None: 1 when the cluster has GPUs, else 0"
    )
    num_cpus_per_engine: float | None = Field(
        None, gt=0, description="split: CPUs Ray reserves for each engine; null: as num_cpus_per_worker"
    )
    num_gpus_per_engine: float | None = Field(
        None, ge=0, description="split: GPUs per engine; None: 1 when the cluster has GPUs, else 0"
    )
    startup_timeout_s: float = Field(
        300.0,
        gt=0,
        description="wait this long for busy resources to free up for every actor, and for engines to serve "
        "(a cluster that cannot hold the actors at all fails at once)",
    )

    @model_validator(mode="after")
    def _engine_knobs_need_split(self) -> RayConfig:
        if self.placement == "colocated":
            defaults = RayConfig.model_fields
            for name in ("num_engines", "num_cpus_per_engine", "num_gpus_per_engine"):
                if getattr(self, name) != defaults[name].default:
                    raise ValueError(
                        f"ray.{name}={getattr(self, name)} is read only with ray.placement=split "
                        "(colocated workers each build their own engine)"
                    )
        return self
