"""The training loop, driven in process by a scripted engine and env, and by the real parts."""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from agentrl.config_loader import load_config
from agentrl.engine.protocol import FinishReason, Generation, SamplingParams
from agentrl.env.base import TextEnv
from agentrl.env.errors import InfraError
from agentrl.rewards.apply import RewardFunctions
from agentrl.rollout.chat_template import ChatTemplate
from agentrl.rollout.trajectory import Status
from agentrl.tiny_policy import DEFAULT_MODEL_PATH
from agentrl.trainer.checkpoint import checkpoint_steps
from agentrl.trainer.components import build_trainer
from agentrl.trainer.data_order import StepSampler
from agentrl.trainer.health import RunStopped
from agentrl.trainer.loop import Trainer, TrainerParts
from agentrl.trainer.policy_worker import PolicyWorker

ROWS = [{"target": str(digit)} for digit in range(8)]
SMALL = [
    "data.train_batch_size=2", "actor.ppo_mini_batch_size=2", "rollout.n=4", "data.val_size=4",
    "trainer.logger=[console]", "trainer.save_freq=0",
]  # fmt: skip


class VersionedScriptedEngine:
    """Replies with the digits in turn and tracks the weight version like a real engine."""

    def __init__(self, tokenizer, logprob: float = -0.5, reply: str | None = None) -> None:
        self.tokenizer, self.version, self.num_calls, self.logprob = tokenizer, 0, 0, logprob
        self.reply = reply  # the same text every time; None: "0" or "7" by the seed
        self.versions_received: list[int] = []

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        reply = self.reply or str(sampling.seed % 2 * 7)  # "0" or "7": members of a group disagree
        self.num_calls += 1
        ids = self.tokenizer.encode(reply, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        return Generation(ids, [self.logprob] * len(ids), FinishReason.STOP, policy_version=self.version)

    async def update_weights(self, state_dict: dict, version: int) -> None:
        self.version = version
        self.versions_received.append(version)

    async def close(self) -> None:
        pass


class TargetEnv(TextEnv):
    """One guess at a digit; `failure` makes every step fail the named way."""

    def __init__(self, failure: str | None = None) -> None:
        super().__init__()
        self.failure = failure

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.target = options["target"]
        return [{"role": "user", "content": "Say a digit."}], {}

    def step(self, action):
        if self.failure == "infra":
            raise InfraError("sandbox unreachable")
        if self.failure == "raise":
            raise ValueError("broken env")
        if self.failure == "malformed":
            return "not a list", None, True, False, {}
        correct = action.strip() == "7"
        return [], float(correct), True, False, {"correct": correct, "num_digits": float(len(action.strip()))}


def scripted_trainer(
    tmp_path: Path,
    *overrides: str,
    failure: str | None = None,
    logprob: float = -0.5,
    make_env: Callable[[], TextEnv] | None = None,
    reply: str | None = None,
    rows: list[dict] = ROWS,
) -> tuple[Trainer, VersionedScriptedEngine]:
    config = load_config([*SMALL, *overrides, f"trainer.run_dir={tmp_path}"])
    tokenizer = AutoTokenizer.from_pretrained(DEFAULT_MODEL_PATH)
    engine = VersionedScriptedEngine(tokenizer, logprob, reply)
    actor = PolicyWorker(
        DEFAULT_MODEL_PATH, config.actor, device="cpu", temperature=config.rollout.temperature
    )
    parts = TrainerParts(
        run_dir=tmp_path, make_env=make_env or (lambda: TargetEnv(failure)), engine=engine, template=ChatTemplate(tokenizer),
        pad_token_id=tokenizer.pad_token_id, actor=actor, reference=None,
        sampler=StepSampler(rows, 2, 0, True), extra_sampler=StepSampler(rows, 2, 1, True), val_rows=rows[:2],
        reward_functions=RewardFunctions([]),
    )  # fmt: skip
    return Trainer(config, parts), engine


def records(run_dir: Path, name: str) -> list[dict]:
    return [json.loads(line) for line in (run_dir / name).read_text().splitlines()]


def test_each_step_trains_on_its_groups_and_serves_the_next_weight_version(tmp_path):
    trainer, engine = scripted_trainer(tmp_path, "trainer.total_training_steps=2")
    before = {name: tensor.clone() for name, tensor in trainer.parts.actor.full_state_dict().items()}
    asyncio.run(trainer.fit())
    assert engine.versions_received == [0, 1, 2]  # the start weights, then one version per update
    assert [record["step"] for record in records(tmp_path, "metrics.jsonl")] == [0, 1, 2]
    step_1 = records(tmp_path, "rollouts/step_1.jsonl")
    assert sorted(t["reward"] for t in step_1) == [0.0] * 4 + [1.0] * 4
    for trajectory in step_1:  # GRPO: +/- (1 - 0.5) / std of a 2-2 split, std = sqrt(1/3)
        assert trajectory["advantage"] == pytest.approx(
            (1 if trajectory["reward"] else -1) * 0.5 / (1 / 3) ** 0.5, rel=1e-5
        )
    metrics = records(tmp_path, "metrics.jsonl")[1]
    assert metrics["env/num_digits/mean"] == 1.0
    assert metrics["rollout/logprob_diff_max"] > 0  # the scripted logprobs are not the model's
    after = trainer.parts.actor.full_state_dict()
    assert any(not torch.equal(before[name], after[name]) for name in before)


@pytest.mark.parametrize(("failure", "status", "example"), [
    ("raise", "env_error", "ValueError: broken env"),
    ("malformed", "env_error", "malformed value"),
    ("infra", "sandbox_error", "sandbox unreachable"),
])  # fmt: skip
def test_a_run_whose_episodes_keep_failing_stops_naming_the_status_and_an_example(
    tmp_path, failure, status, example
):
    trainer, _ = scripted_trainer(
        tmp_path, "trainer.total_training_steps=5", "trainer.max_error_steps=2", "trainer.val_before_train=false",
        failure=failure,
    )  # fmt: skip
    with pytest.raises(RunStopped, match=rf"2 steps in a row .* mostly {status}; for example: .*{example}"):
        asyncio.run(trainer.fit())
    steps = records(tmp_path, "metrics.jsonl")
    assert [record["step"] for record in steps] == [1, 2]
    assert all(
        record["rollout/error_frac"] == 1.0 and record["actor/skipped_update"] == 1.0 for record in steps
    )


class FailsInTheFirstEpisodes(TargetEnv):
    """Raises in the first `num_failing` steps of episodes across all instances (a shared counter)."""

    def __init__(self, counter: itertools.count, num_failing: int) -> None:
        super().__init__()
        self.counter, self.num_failing = counter, num_failing

    def step(self, action):
        if next(self.counter) < self.num_failing:
            raise ValueError("broken only for a while")
        return super().step(action)


def test_a_step_with_nothing_to_train_still_serves_its_version_and_the_next_step_trains(tmp_path):
    counter = itertools.count()  # step 1's 2 groups x 4 episodes all fail; step 2's all succeed
    trainer, engine = scripted_trainer(
        tmp_path, "trainer.total_training_steps=2", "trainer.val_before_train=false", "trainer.test_freq=0",
        make_env=lambda: FailsInTheFirstEpisodes(counter, num_failing=8),
    )  # fmt: skip
    asyncio.run(trainer.fit())
    step_1, step_2 = records(tmp_path, "metrics.jsonl")[:2]
    assert step_1["actor/skipped_update"] == 1.0 and step_1["rollout/error_frac"] == 1.0
    assert "actor/skipped_update" not in step_2 and step_2["rollout/error_frac"] == 0.0
    assert engine.versions_received[:3] == [0, 1, 2]  # version 1 is the unchanged weights, served anyway
    assert {t["policy_version"] for t in records(tmp_path, "rollouts/step_2.jsonl")} == {1}


def _start_sandbox_server(port: int) -> subprocess.Popen:
    server = subprocess.Popen(
        [sys.executable, "-m", "sandbox.server", "--backend", "bwrap", "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while True:
        assert server.poll() is None, "the sandbox server exited at start"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5):
                return server
        except OSError:
            assert time.monotonic() < deadline, "the sandbox server never answered /health"
            time.sleep(0.2)


def test_a_sandbox_server_killed_mid_run_skips_one_update_and_the_run_trains_on_once_it_is_back(
    tmp_path, monkeypatch
):
    from agentrl import metrics as metrics_module
    from envs.code_sandbox import CodeSandboxEnv
    from envs.code_sandbox.synthetic import generate

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    servers = [_start_sandbox_server(port)]
    original_log = metrics_module.MetricsLogger.log

    def kill_after_step_1_and_restart_after_step_2(self, step, values):
        original_log(self, step, values)
        if step == 1:
            servers[-1].kill()  # SIGKILL: step 2's episodes all end as sandbox errors
            servers[-1].wait()
        elif step == 2:
            servers.append(_start_sandbox_server(port))

    monkeypatch.setattr(metrics_module.MetricsLogger, "log", kill_after_step_1_and_restart_after_step_2)
    url = f"http://127.0.0.1:{port}"
    trainer, engine = scripted_trainer(
        tmp_path, "trainer.total_training_steps=3", "trainer.val_before_train=false", "trainer.test_freq=0",
        "rollout.max_infra_retries=0", "trainer.max_error_steps=5",
        make_env=lambda: CodeSandboxEnv(sandbox_url=url, max_turns=1),
        reply="```python\ndef f(a):\n    return a\n```", rows=generate(8, seed=0),
    )  # fmt: skip
    try:
        asyncio.run(trainer.fit())
    finally:
        for server in servers:
            server.kill()
            server.wait()
    steps = records(tmp_path, "metrics.jsonl")
    assert [step["step"] for step in steps] == [1, 2, 3]
    assert [step.get("rollout/status/sandbox_error", 0.0) for step in steps] == [0.0, 1.0, 0.0]
    assert [step.get("actor/skipped_update", 0.0) for step in steps] == [0.0, 1.0, 0.0]
    assert engine.versions_received == [0, 1, 2, 3]
    assert {t["policy_version"] for t in records(tmp_path, "rollouts/step_3.jsonl")} == {2}


def test_a_run_shorter_than_max_error_steps_whose_every_episode_failed_stops_naming_the_status(tmp_path):
    trainer, _ = scripted_trainer(
        tmp_path, "trainer.total_training_steps=2", "trainer.max_error_steps=3", "trainer.max_error_frac=1.0",
        "trainer.val_before_train=false", failure="raise",
    )  # fmt: skip
    with pytest.raises(
        RunStopped,
        match=r"every episode of this run's 2 steps failed, mostly env_error; for example: .*broken env",
    ):
        asyncio.run(trainer.fit())
    assert not (tmp_path / "hf_model").exists()


def test_a_step_where_most_groups_have_equal_rewards_says_there_is_no_signal_and_what_to_try(
    tmp_path, capsys
):
    trainer, _ = scripted_trainer(
        tmp_path, "trainer.total_training_steps=2", "trainer.val_before_train=false", "trainer.test_freq=0",
        reply="7",
    )  # fmt: skip
    asyncio.run(trainer.fit())
    warnings = [line for line in capsys.readouterr().err.splitlines() if "no learning signal" in line]
    expected = (
        "warning: step 1: 100% of groups have equal rewards (reward/mean 1.000), so they give no learning "
        "signal; the policy already solves it: make the task harder, or raise rollout.n, rollout.temperature "
        "or actor.optim.lr"
    )
    assert warnings == [expected]  # said when the signal goes, not again every step


def test_infrastructure_failures_are_retried_with_the_same_task_then_excluded(tmp_path):
    trainer, engine = scripted_trainer(
        tmp_path, "trainer.total_training_steps=1", "trainer.val_before_train=false", "rollout.max_infra_retries=2",
        "trainer.max_error_steps=5", failure="infra",
    )  # fmt: skip
    with pytest.raises(RunStopped, match="every episode of this run's 1 step failed, mostly sandbox_error"):
        asyncio.run(trainer.fit())
    trajectories = records(tmp_path, "rollouts/step_1.jsonl")
    assert {t["status"] for t in trajectories} == {Status.SANDBOX_ERROR.value}
    assert [t["num_infra_retries"] for t in trajectories] == [2] * 8
    assert (
        engine.num_calls == (8 + 2 * 4) * 3
    )  # the step's 8 episodes and the final evaluation's 2 x 4, thrice each, before the run is stopped
    assert records(tmp_path, "metrics.jsonl")[0]["rollout/infra_retries"] == 16.0


def test_kl_loss_runs_through_the_real_loop_with_a_reference_worker(tmp_path):
    config = load_config([
        "env=math", *SMALL, "data.train_batch_size=4", "actor.use_kl_loss=true", "actor.kl_loss_coef=0.5",
        "trainer.total_training_steps=3", "trainer.val_before_train=false", f"trainer.run_dir={tmp_path}",
        "trainer.device=cpu", "engine.device=cpu",
    ])  # fmt: skip
    trainer = build_trainer(config, tmp_path)
    assert trainer.parts.reference is not None
    asyncio.run(trainer.fit())
    steps = records(tmp_path, "metrics.jsonl")
    assert steps[0]["actor/kl_loss"] == 0.0  # the policy starts as the reference
    first_update = next(i for i, step in enumerate(steps) if step["actor/grad_norm"] > 0)
    assert first_update < 2, "no step had reward spread to learn from"
    assert all(step["actor/kl_loss"] > 0.0 for step in steps[first_update + 1 :])
    reference = trainer.parts.reference.full_state_dict()
    original = PolicyWorker(DEFAULT_MODEL_PATH, config.actor, trainable=False).full_state_dict()
    assert all(
        torch.equal(reference[name], original[name]) for name in original
    )  # the reference never trains


def test_training_files_without_val_files_hold_out_a_seeded_split_and_say_so(tmp_path, capsys):
    from agentrl.trainer.components import load_task_data

    rows = [
        {
            "prompt": [{"role": "user", "content": f"q{i}"}],
            "reward_model": {"ground_truth": str(i)},
            "data_source": "t",
        }
        for i in range(10)
    ]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = load_config(["data.generator=null", f"data.train_files=[{path}]", "data.val_size=3"])
    data = load_task_data(config)
    assert len(data.train_rows) == 7 and len(data.val_rows) == 3
    assert not {r["reward_model"]["ground_truth"] for r in data.val_rows} & {
        r["reward_model"]["ground_truth"] for r in data.train_rows
    }
    assert data == load_task_data(config)
    assert "held out of data.train_files" in data.note
    with pytest.raises(ValueError, match="too few to hold out data.val_size=10"):
        load_task_data(load_config(["data.generator=null", f"data.train_files=[{path}]", "data.val_size=10"]))


def test_a_crash_between_a_steps_work_and_its_records_never_loses_its_metrics_line(tmp_path, monkeypatch):
    from agentrl import metrics as metrics_module

    original_log = metrics_module.MetricsLogger.log

    def crash_at_step_2(self, step, values):
        if step == 2:
            raise KeyboardInterrupt("killed while recording step 2")
        original_log(self, step, values)

    overrides = ("trainer.total_training_steps=3", "trainer.save_freq=1", "trainer.val_before_train=false")
    trainer, _ = scripted_trainer(tmp_path, *overrides)
    monkeypatch.setattr(metrics_module.MetricsLogger, "log", crash_at_step_2)
    with pytest.raises(KeyboardInterrupt):
        asyncio.run(trainer.fit())
    monkeypatch.setattr(metrics_module.MetricsLogger, "log", original_log)
    resumed, _ = scripted_trainer(tmp_path, *overrides)
    asyncio.run(resumed.fit())
    assert [record["step"] for record in records(tmp_path, "metrics.jsonl")] == [1, 2, 3]


class CtrlCAtCall(VersionedScriptedEngine):
    """Sends this process a real SIGINT (as Ctrl-C does) at its `at_call`-th generate call."""

    def __init__(self, tokenizer, at_call: int) -> None:
        super().__init__(tokenizer)
        self.at_call = at_call

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        if self.num_calls == self.at_call:
            self.at_call = -1  # once: a second Ctrl-C would skip the run's clean-up
            signal.raise_signal(signal.SIGINT)
            await asyncio.sleep(0)  # the loop's handler cancels the run here
        return await super().generate(prompt_ids, sampling)


def test_ctrl_c_during_a_rollout_saves_the_last_finished_step_and_resuming_trains_what_an_unbroken_run_does(
    tmp_path,
):
    overrides = ("trainer.total_training_steps=3", "trainer.save_freq=0", "trainer.val_before_train=false")
    unbroken, _ = scripted_trainer(tmp_path / "unbroken", *overrides)
    asyncio.run(unbroken.fit())
    interrupted, engine = scripted_trainer(tmp_path / "run", *overrides)
    interrupted.parts.engine = CtrlCAtCall(engine.tokenizer, at_call=2 * 8 + 3)  # during step 3's rollout
    with pytest.raises(KeyboardInterrupt):
        asyncio.run(interrupted.fit())
    assert checkpoint_steps(tmp_path / "run") == [2]  # save_freq=0 would have saved only at the end
    resumed, _ = scripted_trainer(tmp_path / "run", *overrides)
    asyncio.run(resumed.fit())
    assert [record["step"] for record in records(tmp_path / "run", "metrics.jsonl")] == [1, 2, 3]
    expected = unbroken.parts.actor.full_state_dict()
    for name, tensor in resumed.parts.actor.full_state_dict().items():
        assert torch.equal(tensor, expected[name]), name


def test_zero_steps_without_evaluation_finishes_and_saves_the_policy(tmp_path):
    trainer, _ = scripted_trainer(
        tmp_path, "trainer.total_training_steps=0", "trainer.val_before_train=false"
    )
    assert asyncio.run(trainer.fit()) == {}
    assert (tmp_path / "hf_model" / "config.json").is_file()


@pytest.mark.parametrize(
    ("correction", "expected"),
    [
        (["algorithm.rollout_correction.rollout_is=token"], {"rollout_corr/is_weight_max": 2.0, "rollout_corr/is_clip_frac": 1.0}),
        (["algorithm.rollout_correction.rollout_rs=token"], {"rollout_corr/rs_masked_frac": 1.0, "actor/grad_norm": 0.0}),
    ],
    ids=["tis", "mis"],
)  # fmt: skip
def test_a_large_engine_trainer_gap_is_bounded_by_tis_and_mis(tmp_path, correction, expected):
    # The engine claims every sampled token had probability e^-30: the trainer's ratio to it is huge.
    trainer, _ = scripted_trainer(
        tmp_path,
        "trainer.total_training_steps=1",
        "trainer.val_before_train=false",
        *correction,
        logprob=-30.0,
    )
    asyncio.run(trainer.fit())
    (step,) = records(tmp_path, "metrics.jsonl")
    assert step["rollout/logprob_diff_mean"] > 10
    for key, value in expected.items():
        assert step[key] == value, key


def test_async_rollout_trains_on_samples_at_most_max_staleness_versions_old(tmp_path):
    config = load_config([
        "env=math", *SMALL, "data.train_batch_size=4", "rollout.mode=async", "rollout.max_staleness=1",
        "algorithm.rollout_correction.rollout_is=token", "trainer.total_training_steps=3",
        "trainer.val_before_train=false", f"trainer.run_dir={tmp_path}", "trainer.device=cpu", "engine.device=cpu",
    ])  # fmt: skip
    trainer = build_trainer(config, tmp_path)
    asyncio.run(trainer.fit())
    steps = records(tmp_path, "metrics.jsonl")
    assert [step["step"] for step in steps] == [1, 2, 3]
    assert steps[0]["rollout/staleness/max"] == 0.0  # nothing to be stale against yet
    assert all(step["rollout/staleness/max"] <= 1.0 for step in steps)
    assert all("rollout_corr/is_weight_mean" in step for step in steps)
    for step in (2, 3):  # each trajectory's turns were sampled by version step - 1 or step - 2
        for trajectory in records(tmp_path, f"rollouts/step_{step}.jsonl"):
            assert step - 2 <= trajectory["policy_version"] <= step - 1


def test_a_group_older_than_the_staleness_bound_is_found_for_regeneration():
    from agentrl.rollout.trajectory import Trajectory, Turn
    from agentrl.trainer.async_rollout import staleness_metrics, too_stale_groups

    def sampled_by(group_id: int, version: int) -> Trajectory:
        turn = Turn("x", [1], [], [], 0.0, "stop", policy_version=version)
        return Trajectory(group_id=group_id, prompt_ids=[0], turns=[turn], policy_version=version)

    trajectories = [sampled_by(0, 4), sampled_by(1, 3), sampled_by(2, 2)]  # step 6 trains on version 5
    assert too_stale_groups(trajectories, step=6, max_staleness=2) == {2}
    metrics = staleness_metrics(trajectories, step=6)
    assert metrics["rollout/staleness/max"] == 3.0 and metrics["rollout/staleness/1"] == pytest.approx(1 / 3)
