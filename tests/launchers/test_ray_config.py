"""The `ray` section and what the launcher derives from it, without starting Ray."""

from __future__ import annotations

import pytest

from agentrl.config_loader import ConfigError, load_config
from agentrl.launchers.ray_launcher import check_launchable, plan_placement


def test_split_placement_reserves_one_bundle_per_worker_then_one_per_engine():
    config = load_config(
        [
            "env=math",
            "trainer.launcher=ray",
            "ray.placement=split",
            "ray.num_engines=2",
            "ray.num_cpus_per_worker=0.5",
        ]
    )
    placement = plan_placement(config, cluster_has_gpus=False)
    assert placement.bundles == [{"CPU": 0.5}, {"CPU": 0.5}, {"CPU": 1.0}, {"CPU": 1.0}]


def test_on_a_gpu_cluster_each_actor_gets_one_gpu_unless_told_otherwise():
    config = load_config(
        ["env=math", "trainer.launcher=ray", "ray.placement=split", "ray.num_gpus_per_engine=0.5"]
    )
    placement = plan_placement(config, cluster_has_gpus=True)
    assert placement.bundles == [{"CPU": 1.0, "GPU": 1.0}] * 2 + [{"CPU": 1.0, "GPU": 0.5}]


def test_colocated_placement_reserves_only_the_workers():
    config = load_config(["env=math", "trainer.launcher=ray", "ray.num_workers=3"])
    assert plan_placement(config, cluster_has_gpus=False).bundles == [{"CPU": 1.0}] * 3


def test_engine_knobs_are_refused_with_colocated_placement():
    with pytest.raises(ConfigError, match="ray.num_engines=2 is read only with ray.placement=split"):
        load_config(["env=math", "trainer.launcher=ray", "ray.num_engines=2"])


def test_split_placement_refuses_an_sglang_engine_section():
    config = load_config(
        [
            "env=math",
            "trainer.launcher=ray",
            "ray.placement=split",
            "engine=sglang",
            "engine.url=http://127.0.0.1:1",
        ]
    )
    with pytest.raises(ValueError, match="ray.placement=split starts built-in engine servers"):
        check_launchable(config)


def test_an_unknown_launcher_is_a_config_error():
    with pytest.raises(ConfigError, match="launcher"):
        load_config(["env=math", "trainer.launcher=slurm"])
