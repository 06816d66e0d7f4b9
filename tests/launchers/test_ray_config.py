"""The `ray` section and what the launcher derives from it, without starting Ray."""

from __future__ import annotations

import pytest

from agentrl.config_loader import ConfigError, load_config
from agentrl.launchers.ray_launcher import check_fits, check_launchable, plan_placement


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
    placement = plan_placement(config, cluster_has_gpus=False, cluster_cpus=8)
    assert placement.bundles == [{"CPU": 0.5}, {"CPU": 0.5}, {"CPU": 1.0}, {"CPU": 1.0}]


def test_on_a_gpu_cluster_each_actor_gets_one_gpu_unless_told_otherwise():
    config = load_config(
        ["env=math", "trainer.launcher=ray", "ray.placement=split", "ray.num_gpus_per_engine=0.5"]
    )
    placement = plan_placement(config, cluster_has_gpus=True, cluster_cpus=64)
    assert placement.bundles == [{"CPU": 1.0, "GPU": 1.0}] * 2 + [{"CPU": 1.0, "GPU": 0.5}]


def test_colocated_placement_reserves_only_the_workers():
    config = load_config(["env=math", "trainer.launcher=ray", "ray.num_workers=3"])
    assert plan_placement(config, cluster_has_gpus=False, cluster_cpus=4).bundles == [{"CPU": 1.0}] * 3


def test_on_two_cores_the_default_split_shares_the_cpus_out_and_fits():
    config = load_config(["env=math", "trainer.launcher=ray", "ray.placement=split"])
    placement = plan_placement(config, cluster_has_gpus=False, cluster_cpus=2)
    assert placement.bundles == [{"CPU": 0.6666}] * 3  # two workers and one engine
    check_fits(placement, [{"CPU": 2.0, "memory": 1e9}])


def test_cpu_counts_the_cluster_cannot_hold_fail_at_once_naming_the_knobs():
    config = load_config(
        ["env=math", "trainer.launcher=ray", "ray.num_workers=3", "ray.num_cpus_per_worker=1"]
    )
    placement = plan_placement(config, cluster_has_gpus=False, cluster_cpus=2)
    with pytest.raises(ValueError, match=r"that is 3 CPU \(at most 1 per actor\), and it has 2 CPU") as error:
        check_fits(placement, [{"CPU": 2.0}])
    assert (
        "Lower ray.num_workers, ray.num_engines or ray.num_cpus_per_worker, ray.num_cpus_per_engine"
        in str(error.value)
    )


def test_an_actor_larger_than_every_node_fails_at_once_though_the_total_would_hold_it():
    config = load_config(
        ["env=math", "trainer.launcher=ray", "ray.num_workers=1", "ray.num_cpus_per_worker=2"]
    )
    placement = plan_placement(config, cluster_has_gpus=False, cluster_cpus=2)
    with pytest.raises(ValueError, match=r"at most 1 on one node"):
        check_fits(placement, [{"CPU": 1.0}, {"CPU": 1.0}])


def test_gpus_asked_of_a_cpu_cluster_fail_at_once_naming_the_gpu_knobs():
    config = load_config(["env=math", "trainer.launcher=ray", "ray.num_gpus_per_worker=1"])
    placement = plan_placement(config, cluster_has_gpus=False, cluster_cpus=2)
    with pytest.raises(ValueError, match=r"2 GPU .*ray.num_gpus_per_worker, ray.num_gpus_per_engine"):
        check_fits(placement, [{"CPU": 2.0}])


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
