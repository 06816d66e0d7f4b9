"""The eval command's rollout and scores, driven by a scripted policy whose answers are known."""

import re

import pytest

from agentrl.config import Config
from agentrl.config_loader import load_config
from agentrl.engine.protocol import FinishReason, Generation, SamplingParams
from agentrl.eval.run import evaluate
from agentrl.model_path import load_tokenizer, resolve_model_path
from agentrl.testing.scripted import ScriptedEngine
from agentrl.trainer.components import load_task_data
from envs.math import FEEDBACK


class KnownAnswersEngine:
    """Answers "What is a * b?": right at once when 3 divides a, on the second try when it divides b, else never."""

    def __init__(self) -> None:
        self.tokenizer = load_tokenizer(resolve_model_path("tiny"))

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        prompt = self.tokenizer.decode(prompt_ids)
        a, b = map(int, re.search(r"What is (\d+) \* (\d+)\?", prompt).groups())
        retried = FEEDBACK in prompt
        right = a % 3 == 0 or (b % 3 == 0 and retried)
        ids = self.tokenizer.encode(f"\\boxed{{{a * b if right else a * b + 1}}}", add_special_tokens=False)
        ids.append(self.tokenizer.eos_token_id)
        return Generation(ids, [-0.5] * len(ids), FinishReason.STOP, 0)

    async def update_weights(self, state_dict: dict, version: int) -> None:
        pass

    async def close(self) -> None:
        pass


def factors(config: Config) -> list[tuple[int, int]]:
    prompts = [row["prompt"][0]["content"] for row in load_task_data(config).val_rows]
    return [tuple(map(int, re.search(r"What is (\d+) \* (\d+)\?", p).groups())) for p in prompts]


def test_pass_at_k_and_pass_at_turn_match_the_scripted_policy():
    config = load_config(["env=multiturn", "data.val_size=12", "rollout.val_kwargs.n=3"])
    expected_first = sum(a % 3 == 0 for a, _ in factors(config)) / 12
    expected_by_second = sum(a % 3 == 0 or b % 3 == 0 for a, b in factors(config)) / 12
    assert 0 < expected_first < expected_by_second < 1  # the rows exercise every case
    result = evaluate(config, ks=[1, 3], engine=KnownAnswersEngine())
    [(name, scores)] = result.scores.items()
    assert name == "examples.multiturn_env:TimesTableRetryEnv"
    # every sample of a problem answers alike: pass@k is the fraction solved within the 2 attempts
    assert scores.pass_at_k == pytest.approx({1: expected_by_second, 3: expected_by_second})
    assert scores.pass_at_turn == pytest.approx({1: expected_first, 2: expected_by_second})
    assert (scores.num_problems, scores.num_samples, scores.error_frac) == (12, 3, 0.0)


def test_a_mixture_is_scored_per_env():
    config = load_config(["env=multiturn", "data.val_size=8", "rollout.val_kwargs.n=2"])
    rows = {"generator": "examples.custom_env:generate", "train_size": 16, "val_size": 8}
    mixed = Config.model_validate({
        **config.model_dump(exclude={"env", "data"}),
        "data": {"train_batch_size": 8},
        "env": {"mixture": {
            "once": {"id": "examples.custom_env:TimesTableEnv", "data": rows, "rollout": {"max_turns": 1}},
            "retry": {"id": "examples.multiturn_env:TimesTableRetryEnv", "kwargs": {"max_attempts": 2}, "data": rows},
        }},
    })  # fmt: skip
    result = evaluate(mixed, ks=[1], engine=KnownAnswersEngine())
    first = sum(a % 3 == 0 for a, _ in factors(config)) / 8
    by_second = sum(a % 3 == 0 or b % 3 == 0 for a, b in factors(config)) / 8
    assert result.scores["once"].pass_at_k == pytest.approx({1: first})
    assert result.scores["once"].pass_at_turn == pytest.approx({1: first})
    assert result.scores["retry"].pass_at_k == pytest.approx({1: by_second})
    assert result.scores["retry"].pass_at_turn == pytest.approx({1: first, 2: by_second})


def test_an_env_with_only_the_async_api_is_evaluated():
    # The code env is built once at set-up (sync) and rolled out in the event loop: a reply without
    # code is asked for a code block and fails every problem on both attempts, and nothing errors.
    config = load_config(["env=code_sandbox", "data.val_size=2", "rollout.val_kwargs.n=2"])
    engine = ScriptedEngine(load_tokenizer(resolve_model_path("tiny")), ["I cannot write it."])
    [scores] = evaluate(config, ks=[1, 2], engine=engine).scores.values()
    assert (scores.pass_at_k, scores.error_frac) == ({1: 0.0, 2: 0.0}, 0.0)
    assert scores.pass_at_turn == {1: 0.0, 2: 0.0}
    assert (scores.num_first_turn_misses, scores.fix_rate) == (4, 0.0)
