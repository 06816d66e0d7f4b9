import warnings

import pytest
from gymnasium.utils.env_checker import check_env

from agentrl.env import TextEnv, make, register, registered_ids, registry
from tests.env.scripted_envs import SyncCountdown


@pytest.fixture
def isolated_registry(monkeypatch):
    """Registrations made by a test disappear after it."""
    registry.registered_ids()  # discover installed envs before taking the copy
    monkeypatch.setattr(registry, "_registry", dict(registry._registry))


def test_the_built_in_math_env_is_discovered_through_entry_points():
    assert "math" in registered_ids()
    assert type(make("math")).__name__ == "MathEnv"


def test_every_registered_env_passes_gymnasiums_env_checker():
    ids = registered_ids()
    assert ids, "no env is registered; install the project with `pip install -e .`"
    for env_id in ids:
        env = make(env_id)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            check_env(env.unwrapped)
        env.close()


def test_make_passes_kwargs_over_the_registered_defaults(isolated_registry):
    register("countdown", SyncCountdown, start=3)
    assert make("countdown").start == 3
    assert make("countdown", start=5).start == 5
    assert make("math", max_attempts=4).max_attempts == 4


def test_a_string_entry_point_is_imported_only_when_the_env_is_made(isolated_registry):
    register("later", "tests.env.not_a_module:Env")
    assert "later" in registered_ids()
    with pytest.raises(ValueError, match="cannot import module 'tests.env.not_a_module'"):
        make("later")


def test_make_builds_an_unregistered_env_from_a_module_and_class_reference():
    env = make("tests.env.scripted_envs:SyncCountdown", start=4)
    assert isinstance(env, SyncCountdown)
    assert env.start == 4
    assert env.spec.id == "tests.env.scripted_envs:SyncCountdown"


def test_an_unknown_id_error_suggests_the_closest_registered_id_and_how_to_register(isolated_registry):
    register("countdown", SyncCountdown)
    with pytest.raises(ValueError) as error:
        make("countdwn")
    message = str(error.value)
    assert "unknown env id 'countdwn'" in message
    assert "Did you mean 'countdown'?" in message
    assert "agentrl.env.register(id, 'package.module:Class')" in message


def test_a_reference_to_something_that_is_not_a_text_env_is_rejected():
    with pytest.raises(ValueError, match="is not a TextEnv subclass"):
        make("tests.env.scripted_envs:NotAnEnv")
    with pytest.raises(ValueError, match="has no attribute 'Missing'"):
        make("tests.env.scripted_envs:Missing")


@pytest.mark.parametrize("entry_point", ["no_colon", "a:b:c", 3, dict])
def test_register_rejects_an_entry_point_that_is_not_a_class_or_reference(entry_point):
    with pytest.raises(ValueError, match="entry_point must be"):
        register("bad", entry_point)


def test_register_rejects_an_id_containing_a_colon():
    with pytest.raises(ValueError, match="without ':'"):
        register("a:b", SyncCountdown)


def test_registering_an_id_again_replaces_it(isolated_registry):
    class Other(TextEnv):
        pass

    register("countdown", SyncCountdown)
    register("countdown", Other)
    assert type(make("countdown")) is Other
