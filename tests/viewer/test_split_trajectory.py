"""The viewer on an episode trained as several samples: every sample shown, with a marker between."""

from __future__ import annotations

import copy
import urllib.request

from agentrl.viewer.token_view import SAMPLE_BOUNDARY, token_cells
from tests.viewer.conftest import start_viewer
from tests.viewer.run_dirs import STEP_1, write_jsonl, write_run


def split_record() -> dict:
    """STEP_1's two-turn trajectory as two samples: the first turn, then the second from a full render."""
    record = copy.deepcopy(STEP_1[1])
    first_turn = record["turns"][0]
    cut = len(first_turn["completion_ids"])
    record["earlier_segments"] = [
        {
            "prompt_ids": record["prompt_ids"],
            "response_ids": record["response_ids"][:cut],
            "loss_mask": record["loss_mask"][:cut],
            "rollout_logprobs": record["rollout_logprobs"][:cut],
        }
    ]
    cut_observation = cut + len(first_turn["observation_ids"])
    record["prompt_ids"] = record["prompt_ids"] + record["response_ids"][:cut_observation]
    for key in ("response_ids", "loss_mask", "rollout_logprobs"):
        record[key] = record[key][cut_observation:]
    first_turn["starts_new_sample"], first_turn["observation_ids"] = True, []
    return record


def test_token_cells_put_a_boundary_between_samples_and_keep_every_token():
    record = split_record()
    cells = token_cells(record, None)
    kinds = [cell.kind for cell in cells]
    assert kinds.count("boundary") == 1 and cells[kinds.index("boundary")].text == SAMPLE_BOUNDARY
    earlier = record["earlier_segments"][0]
    assert kinds.index("boundary") == len(earlier["prompt_ids"]) + len(earlier["response_ids"])
    assert kinds.count("sampled") == sum(earlier["loss_mask"]) + sum(record["loss_mask"])


def test_the_trajectory_page_of_a_split_episode_shows_the_marker(tmp_path):
    run_dir = write_run(tmp_path / "runs" / "math_run")
    write_jsonl(run_dir / "rollouts" / "step_2.jsonl", [split_record()])
    process, url = start_viewer(run_dir.parent)
    try:
        page = urllib.request.urlopen(f"{url}/runs/math_run/train/2/0").read().decode()
    finally:
        process.kill()
        process.wait()
    assert f'<div class="sample-boundary">{SAMPLE_BOUNDARY}</div>' in page
    assert '<dd class="num-samples">2</dd>' in page
