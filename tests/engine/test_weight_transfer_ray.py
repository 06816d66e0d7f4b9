"""Ray split placement with `engine.weight_sync=distributed` trains what one process trains.

The policy workers and the engine actor are processes of their own; rank 0 broadcasts the
weights to the engine over gloo after each step, and nothing is written for the engine to load.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from agentrl.train import main
from tests.launchers.conftest import ray_instance  # noqa: F401 - a fixture
from tests.launchers.test_ray_training import TINY_RUN, episodes, one_process_run  # noqa: F401 - a fixture

pytestmark = pytest.mark.slow  # Ray actors that train


def test_split_placement_with_weights_broadcast_trains_what_one_process_trains(
    ray_instance,  # noqa: F811 - the imported fixture
    one_process_run: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    overrides = ["trainer.launcher=ray", "ray.placement=split", "engine.weight_sync=distributed"]
    assert main([*TINY_RUN, *overrides, f"trainer.run_dir={tmp_path}"]) == 0
    for step in (1, 2):  # step 2 was sampled from the weights step 1 broadcast to the engine
        assert episodes(tmp_path, step) == episodes(one_process_run, step)
    ray_weights = AutoModelForCausalLM.from_pretrained(tmp_path / "hf_model").state_dict()
    one_weights = AutoModelForCausalLM.from_pretrained(one_process_run / "hf_model").state_dict()
    for name, tensor in one_weights.items():
        torch.testing.assert_close(ray_weights[name], tensor, rtol=0, atol=1e-5)
