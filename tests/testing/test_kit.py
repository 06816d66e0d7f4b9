"""The env testing kit catches the bugs it exists for."""

import pytest
from transformers import AutoTokenizer

from agentrl.engine.protocol import SamplingParams
from agentrl.env import TextEnv
from agentrl.testing import (
    EnvContractError,
    ScriptedEngine,
    answer_probes,
    check_env_contract,
    find_reward_hacks,
    play_sync,
)
from envs.math.synthetic import generate

ROWS = generate(3, difficulty=1, seed=0)


class EchoEnv(TextEnv):
    """Rewards a reply equal to the row's answer; the knobs switch on one bug each."""

    def __init__(self, ignore_row=False, unseeded=False, bad_reward=False, pays_any_box=False):
        super().__init__()
        self.ignore_row, self.unseeded, self.bad_reward, self.pays_any_box = (
            ignore_row,
            unseeded,
            bad_reward,
            pays_any_box,
        )
        self.counter = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        row = ROWS[0] if self.ignore_row or not options else options
        self.answer = row["reward_model"]["ground_truth"]
        self.counter += self.unseeded
        return [{"role": "user", "content": row["prompt"][0]["content"] + "!" * self.counter}], {}

    def step(self, action):
        paid = action.strip() == self.answer or (self.pays_any_box and self.answer in action)
        return [], None if self.bad_reward else float(paid), True, False, {}


def test_a_well_behaved_env_passes_the_contract():
    check_env_contract(EchoEnv(), ROWS)


def test_an_env_that_ignores_the_row_fails_the_contract():
    with pytest.raises(EnvContractError, match="rows 0 and 1 have different prompts but reset"):
        check_env_contract(EchoEnv(ignore_row=True), ROWS)


def test_an_env_that_is_not_deterministic_under_a_seed_fails_the_contract():
    with pytest.raises(EnvContractError, match="row 0: two episodes with seed 0 and the same replies differ"):
        check_env_contract(EchoEnv(unseeded=True), ROWS)


def test_a_malformed_step_return_fails_the_contract_naming_it():
    with pytest.raises(EnvContractError, match="row 0: step's reward must be a finite number, got None"):
        check_env_contract(EchoEnv(bad_reward=True), ROWS)


def test_play_returns_every_step_and_refuses_a_script_longer_than_the_episode():
    answer = ROWS[1]["reward_model"]["ground_truth"]
    episode = play_sync(EchoEnv(), [answer], row=ROWS[1])
    assert (episode.total_reward, episode.done, episode.messages) == (1.0, True, ROWS[1]["prompt"])
    with pytest.raises(ValueError, match="the episode ended after reply 0, but the script has 2 replies"):
        play_sync(EchoEnv(), [answer, "again"], row=ROWS[1])


def test_probes_find_an_env_that_pays_an_answer_anywhere_in_the_reply():
    answer = ROWS[2]["reward_model"]["ground_truth"]
    paid = find_reward_hacks(EchoEnv(pays_any_box=True), ROWS[2], answer_probes(answer))
    assert [result.probe.name for result in paid] == [
        "unboxed_answer",
        "unclosed_box",
        "right_then_wrong",
        "both_answers_in_one_box",
    ]
    assert find_reward_hacks(EchoEnv(), ROWS[2], answer_probes(answer)) == []


async def test_the_scripted_engine_replays_replies_as_tokens_then_eos():
    tokenizer = AutoTokenizer.from_pretrained("agentrl/assets/tiny_policy")
    engine = ScriptedEngine(tokenizer, ["\\boxed{4}", "no"], policy_version=2)
    first = await engine.generate([1, 2], SamplingParams(max_new_tokens=64))
    second = await engine.generate([3], SamplingParams(max_new_tokens=1))
    assert tokenizer.decode(first.completion_ids) == "\\boxed{4}" + tokenizer.eos_token
    assert (first.policy_version, second.finish_reason.value, len(second.completion_ids)) == (2, "length", 1)
    assert engine.calls == [[1, 2], [3]]
