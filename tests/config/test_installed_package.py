from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_presets_and_the_default_policy_work_from_an_installed_package(tmp_path):
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-q", "--target", str(target), str(REPO)],
        check=True, timeout=300, capture_output=True,
    )  # fmt: skip
    probe = (
        "from agentrl.config_loader import load_config, config_groups\n"
        "from agentrl.tiny_policy import DEFAULT_MODEL_PATH\n"
        "config = load_config(['env=custom'])\n"
        "print(config.env.id, sorted(config_groups()['env']), DEFAULT_MODEL_PATH.joinpath('model.safetensors').is_file())\n"
        "import agentrl; print(agentrl.__file__)\n"
    )
    result = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(target)!r})\n{probe}"],
        check=False, capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "examples.custom_env:WordArithmeticEnv ['custom', 'math'] True"
    assert lines[1].startswith(str(target))
