"""The viewer on the run directory a real two-step training run writes."""

from __future__ import annotations

import subprocess
import sys

import pytest
from selenium.webdriver.common.by import By

from tests.viewer.conftest import start_viewer
from tests.viewer.test_browser import navigate


@pytest.mark.slow
def test_the_viewer_shows_a_real_runs_steps_and_a_trajectorys_tokens(tmp_path, browser, screenshots):
    run_dir = tmp_path / "math"
    subprocess.run(
        [sys.executable, "-m", "agentrl.train", "env=math", "trainer.total_training_steps=2",
         "data.train_batch_size=4", "actor.ppo_mini_batch_size=2", "rollout.n=4", "data.val_size=8",
         "trainer.logger=[console]", f"trainer.run_dir={run_dir}"],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    process, url = start_viewer(run_dir)
    try:
        browser.get(f"{url}/runs/math")
        assert len(browser.find_elements(By.CSS_SELECTOR, "svg.plot")) >= 4
        navigate(browser, browser.find_elements(By.CSS_SELECTOR, "a.rollouts-link[data-split='train']")[0])
        assert browser.find_element(By.CSS_SELECTOR, "p.count").text == "16 of 16 trajectories in 4 groups"
        navigate(browser, browser.find_elements(By.CSS_SELECTOR, "tr.trajectory-row a")[0])
        sampled = "".join(t.text for t in browser.find_elements(By.CSS_SELECTOR, ".tokens .tok.sampled"))
        assert sampled.endswith("<|im_end|>")
        browser.save_screenshot(str(screenshots / "real_run_trajectory.png"))
    finally:
        process.terminate()
        process.wait(timeout=10)
