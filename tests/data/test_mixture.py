"""Several envs in one run: the schema, each step's shares and the tagged rows."""

import pytest

from agentrl.config_loader import ConfigError, load_config
from agentrl.data_mixture import MixtureSampler, step_shares, tag_rows


def rows(env, count):
    return [{"prompt": [{"role": "user", "content": f"{env}{i}"}], "env": env} for i in range(count)]


def test_shares_split_the_batch_by_weight_with_the_largest_remainders():
    assert step_shares({"math": 1, "code": 1, "tool": 1}, 16) == {"math": 6, "code": 5, "tool": 5}
    assert step_shares({"math": 3, "code": 1}, 8) == {"math": 6, "code": 2}
    assert step_shares({"math": 0.5, "code": 0.3, "tool": 0.2}, 10) == {"math": 5, "code": 3, "tool": 2}


def test_an_env_without_a_row_per_step_is_an_error():
    with pytest.raises(ValueError, match=r"env.mixture.code no row per step"):
        step_shares({"math": 10, "code": 1}, 4)


def test_every_step_takes_each_envs_share_deterministically():
    all_rows = rows("math", 6) + rows("code", 4)
    sampler = MixtureSampler(all_rows, {"math": 2, "code": 1}, batch_size=3, seed=0, shuffle=True)
    for step in range(5):
        batch, row_ids = sampler.batch(step)
        assert [row["env"] for row in batch] == ["math", "math", "code"]
        assert [all_rows[i] for i in row_ids] == batch
        assert MixtureSampler(all_rows, {"math": 2, "code": 1}, 3, 0, True).batch(step) == (batch, row_ids)
    # one epoch of math (3 steps of 2 rows) covers every math row once
    math_ids = [i for step in range(3) for i in sampler.batch(step)[1][:2]]
    assert sorted(math_ids) == [0, 1, 2, 3, 4, 5]


def test_rows_are_tagged_with_their_env_and_a_conflicting_tag_is_an_error():
    assert tag_rows([{"a": 1}], "math", "src") == [{"a": 1, "env": "math"}]
    with pytest.raises(ValueError, match=r"src row 0: column 'env' is 'code'"):
        tag_rows([{"env": "code"}], "math", "src")


def test_the_mixed_preset_keeps_each_envs_settings():
    config = load_config(["env=mixed"])
    assert list(config.env.mixture) == ["math", "code", "tool"]
    assert config.env.mixture["code"].kwargs["backend"] == "auto"
    assert config.env.mixture["math"].data.generator == "envs.math.synthetic:generate"
    # The multi-turn envs keep their single-env presets' turns, tools and tasks.
    for name, preset in (("code", "code_sandbox"), ("tool", "tool_calling")):
        single = load_config([f"env={preset}"])
        entry = config.env.mixture[name]
        assert entry.kwargs == single.env.kwargs, name
        assert entry.data.generator_kwargs == single.data.generator_kwargs, name
        assert entry.rollout.max_turns == single.rollout.max_turns > 1, name
        assert entry.rollout.max_tokens_per_episode == single.rollout.max_tokens_per_episode, name


def test_a_single_env_setting_beside_a_mixture_is_rejected_naming_where_it_belongs():
    with pytest.raises(
        ConfigError, match=r"data.generator is set but env.mixture.*env.mixture.<name>.data.generator"
    ):
        load_config(["env=mixed", "data.generator=envs.math.synthetic:generate"])
    with pytest.raises(ConfigError, match=r"env.kwargs is set but env.mixture"):
        load_config(["env=mixed", "env.kwargs={max_attempts: 2}"])


def test_a_mixture_env_without_rows_is_rejected():
    with pytest.raises(
        ConfigError, match=r"set env.mixture.math.data.train_files=\[...\] or env.mixture.math.data.generator"
    ):
        load_config(["env=mixed", "env.mixture.math.data.generator=null"])


def test_mixture_names_must_fit_metric_keys():
    with pytest.raises(ConfigError, match=r"env.mixture name 'a/b' must be letters"):
        load_config(["env=mixed", "env.mixture={a/b: {id: math, data: {generator: x:y}}}"])


def test_a_mixture_env_that_rejects_its_kwargs_fails_when_the_routes_are_built_naming_it():
    from agentrl.trainer.components import build_routes

    config = load_config(["env=mixed", "env.mixture.tool.kwargs.no_such_knob=1"])
    with pytest.raises(
        ValueError, match=r"env.mixture.tool: env 'tool_calling' cannot be built with kwargs="
    ):
        build_routes(config)
