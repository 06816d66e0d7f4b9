import pytest

from agentrl.env.spaces import ChatMessages, Text


def test_text_space_contains_any_unicode_string_up_to_its_max_length():
    space = Text(max_length=12)
    assert "\\boxed{½}\n" in space
    assert "x" * 12 in space
    assert "x" * 13 not in space
    assert Text(max_length=5, min_length=2).contains("a") is False


def test_text_space_rejects_values_that_are_not_strings():
    space = Text()
    assert 5 not in space
    assert None not in space
    assert ["text"] not in space


def test_text_space_samples_are_members_and_reproducible_after_seeding():
    first, second = Text(max_length=10), Text(max_length=10)
    first.seed(7)
    second.seed(7)
    samples = [first.sample() for _ in range(5)]
    assert samples == [second.sample() for _ in range(5)]
    assert all(sample in first for sample in samples)


def test_text_space_rejects_inverted_length_bounds():
    with pytest.raises(ValueError, match="min_length=5, max_length=2"):
        Text(max_length=2, min_length=5)


def test_chat_messages_space_contains_role_content_dicts_with_extra_keys():
    space = ChatMessages()
    assert [] in space
    assert [{"role": "user", "content": "hi"}, {"role": "tool", "content": "3", "name": "calc"}] in space


@pytest.mark.parametrize(
    "value",
    [
        "hi",
        [{"role": "narrator", "content": "hi"}],
        [{"role": "user", "content": 3}],
        [{"role": "user"}],
        [("user", "hi")],
        [{"role": "user", "content": "hi", 1: "x"}],
    ],
)
def test_chat_messages_space_rejects_malformed_messages(value):
    assert value not in ChatMessages()


def test_chat_messages_space_limits_the_number_of_messages_and_roles():
    space = ChatMessages(max_messages=1, roles=("user",))
    assert [{"role": "user", "content": "a"}] in space
    assert [{"role": "user", "content": "a"}] * 2 not in space
    assert [{"role": "tool", "content": "a"}] not in space


def test_chat_messages_samples_are_members_and_reproducible_after_seeding():
    first, second = ChatMessages(), ChatMessages()
    first.seed(3)
    second.seed(3)
    samples = [first.sample() for _ in range(5)]
    assert samples == [second.sample() for _ in range(5)]
    assert all(sample in first for sample in samples)


def test_chat_messages_space_rejects_an_empty_role_list():
    with pytest.raises(ValueError, match="at least one role"):
        ChatMessages(roles=())
