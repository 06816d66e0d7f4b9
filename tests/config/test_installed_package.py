from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_presets_and_the_default_policy_work_from_an_installed_package(tmp_path):
    # Build from a clean copy: setuptools builds in the source tree, and a build/ left there by an
    # earlier install could carry modules that no longer exist into the package.
    source, target = tmp_path / "source", tmp_path / "site"
    shutil.copytree(
        REPO,
        source,
        ignore=shutil.ignore_patterns(".git", ".venv", "build", "runs", "*.egg-info", "__pycache__"),
    )
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-q", "--target", str(target), str(source)],
        check=True, timeout=300, capture_output=True,
    )  # fmt: skip
    probe = (
        "from agentrl.config_loader import load_config, config_groups\n"
        "from agentrl.tiny_policy import DEFAULT_MODEL_PATH\n"
        "config = load_config(['env=custom'])\n"
        "print(config.env.id, sorted(config_groups()['env']), DEFAULT_MODEL_PATH.joinpath('model.safetensors').is_file())\n"
        "import agentrl; print(agentrl.__file__)\n"
        "import examples.custom_env; print(examples.custom_env.__file__)\n"
    )
    result = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(target)!r})\n{probe}"],
        check=False, capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    presets = sorted(path.stem for path in (REPO / "configs" / "env").glob("*.yaml"))
    assert lines[0] == f"examples.custom_env:TimesTableEnv {presets} True"
    assert lines[1].startswith(str(target))
    assert lines[2].startswith(str(target))  # the examples a preset names are installed too
