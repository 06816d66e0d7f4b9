"""A malformed command line ends with exit status 2 and one line saying what is wrong, never a traceback."""

from __future__ import annotations

import re
import subprocess
import sys
import typing
from collections.abc import Iterator

import pytest
from pydantic import BaseModel

from agentrl.config import Config
from agentrl.config_loader import ConfigError, load_config
from agentrl.train import main

LONG = "x" * 5000

MALFORMED = [
    (
        f"trainer.experiment_name={LONG}",
        "trainer.experiment_name: it names the run dir runs/<experiment_name>",
    ),
    ("trainer.run_dir=/dev/null", "run dir /dev/null is not a directory"),
    ("trainer.run_dir=/proc/nope", "run dir /proc/nope cannot be used (No such file or directory)"),
    ("trainer.seed=${nonexistent}", "trainer.seed: cannot resolve the interpolation"),
    ("rollout.val_kwargs=[1,2]", "'rollout.val_kwargs' is a section of settings, not a value"),
    (f"trainer.project_name={'y' * 120_000}", "trainer.project_name: a Weights & Biases project name"),
    ("reward.weights=[nan]", "reward.weights.0: Input should be a finite number"),
    ("rollout.temperature=nan", "rollout.temperature: Input should be a finite number"),
    ("rollout.temperature=inf", "rollout.temperature: Input should be a finite number"),
]

# More of each kind: types, unknown keys, bad lists, empty values, unicode, very long values and
# paths, bad interpolations, numbers out of range.
MORE_MALFORMED = [
    "rollout.n=", "rollout.n=[1]", "rollout.n={a:1}", "rollout.n=1e400", "rollout.n=١", "rollout.n.x=1",
    "rollout=3", "rollout=[1]", "rollout.val_kwargs=3", "algorithm.filter_groups=true",
    "reward.custom_reward_function=x", "env.kwargs=3", "env.kwargs=[1]", "data.generator_kwargs=[1]",
    "trainer.logger=console", "trainer.logger.x=1", "trainer.logger=[bogus]", "data.train_files=x.jsonl",
    "data.train_files=[", "data.train_files=[[1]]", "data.val_files=[${x}]", "actor.optim.betas=[0.9]",
    "actor.optim.betas=[nan,0.9]", "actor.optim.lr=1e400", "actor.kl_loss_coef=-inf", "rollout.top_p=nan",
    "trainer.max_error_frac=nan", "rollout.step_timeout_s=inf", "=3", "a..b=1", "rollout..n=1", "☃=1",
    "rollout.☃=1", "defaults.env=nope", "env=", "env=math,custom", "trainer.experiment_name=",
    "trainer.experiment_name=.", "trainer.experiment_name=..", "trainer.experiment_name=a/b",
    f"trainer.experiment_name={'é' * 128}", "trainer.project_name=a/b", "trainer.project_name=",
    "trainer.seed=-1", f"trainer.seed={2**64}", "trainer.seed=1.5", "trainer.num_threads=100000",
    "trainer.seed=${trainer.seed}", "trainer.seed=${trainer}", "rollout.temperature=${oc.env:NO_SUCH_VARIABLE}",
    "env.kwargs.a.b=${nope}", f"model.path={LONG}", f"reward.custom_reward_function.path={LONG}",
    "data.generator=null", f"data.train_files=[{LONG}.jsonl]", f"data.val_files=[{LONG}.jsonl]",
    f"trainer.run_dir=/tmp/{LONG}/run", "model.path=\x7f", "trainer.run_dir=/dev/null/run",
    "rollout.mode=ASYNC",
]  # fmt: skip


def run_main(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    status = main(["env=math", *args])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def assert_one_error_line(status: int, out: str, err: str) -> str:
    assert status == 2, err
    assert out == ""
    assert "Traceback" not in err
    assert err.startswith("error: ") and err.endswith("\n") and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize(("line", "message"), MALFORMED, ids=[line[:40] for line, _ in MALFORMED])
def test_each_malformed_line_exits_2_with_one_line_naming_the_problem(
    tmp_path, monkeypatch, capsys, line, message
):
    monkeypatch.chdir(tmp_path)
    extra = ["reward.funcs=[examples.trl_reward:correct_answer]"] if line.startswith("reward.weights") else []
    err = assert_one_error_line(*run_main(capsys, *extra, line))
    assert message in err
    assert len(err) < 600  # a 120 KB value is not echoed back whole
    assert list(tmp_path.iterdir()) == []  # nothing was started, not even a run dir


@pytest.mark.parametrize("line", MORE_MALFORMED, ids=[line[:40] for line in MORE_MALFORMED])
def test_more_malformed_lines_also_exit_2_with_one_line(tmp_path, monkeypatch, capsys, line):
    monkeypatch.chdir(tmp_path)
    assert_one_error_line(*run_main(capsys, line))
    assert list(tmp_path.iterdir()) == []


def test_the_entry_point_reports_a_malformed_line_the_same_way(tmp_path):
    lines = [MALFORMED[2][0], MALFORMED[5][0]]  # a run dir that cannot be created; a 120 KB value
    for line in lines:
        result = subprocess.run(
            [sys.executable, "-m", "agentrl.train", "env=math", line],
            cwd=tmp_path, check=False, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert result.returncode == 2, result.stderr[-2000:]
        assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: "), result.stderr[-2000:]


def float_settings(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, object]]:
    """(dotted key, annotation) of every setting that holds a float (alone, optional, or in a list or tuple)."""
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield from float_settings(annotation, f"{prefix}{name}.")
        elif annotation is float or float in typing.get_args(annotation):
            yield f"{prefix}{name}", annotation


FLOAT_SETTINGS = dict(float_settings(Config))


def test_the_float_settings_are_all_found():
    assert {"rollout.temperature", "rollout.top_p", "reward.weights", "actor.optim.lr", "actor.optim.betas",
            "actor.kl_loss_coef", "actor.entropy_coeff", "actor.clip_ratio_low"} <= set(FLOAT_SETTINGS)  # fmt: skip


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
@pytest.mark.parametrize("key", sorted(FLOAT_SETTINGS))
def test_no_float_setting_takes_a_nan_or_an_infinity(key, value):
    container = typing.get_origin(FLOAT_SETTINGS[key]) in (list, tuple)
    override = f"{key}=[{value},{value}]" if container else f"{key}={value}"
    with pytest.raises(ConfigError, match=re.escape(key) + r"(\.0)?: Input should be a finite number"):
        load_config(["env=math", override])
