import asyncio
import threading

import pytest

from agentrl.rewards.answers import AnswerGrader, Verdict, shared_grader
from envs.math.reward import extract_boxed_answer, score_reply


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("The answer is \\boxed{42}.", "42"),
        ("First \\boxed{1}, no wait: \\boxed{2}", "2"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{\\sqrt{\\frac{a}{b}}} done", "\\sqrt{\\frac{a}{b}}"),
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),
        ("\\boxed { 7 }", "7"),
        ("no box here: 42", None),
        ("\\boxed{}", None),
        ("\\boxed{3} and then \\boxed{4", None),
        ("\\boxed 5", None),
    ],
)
def test_the_answer_is_the_content_of_the_last_balanced_boxed_group(reply, expected):
    assert extract_boxed_answer(reply) == expected


@pytest.mark.parametrize(
    ("reply", "ground_truth", "reward"),
    [
        ("\\boxed{1/2}", "0.5", 1.0),
        ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),
        ("\\boxed{12}", "12", 1.0),
        ("\\boxed{-3}", "-3", 1.0),
        ("\\boxed{13}", "12", 0.0),
        ("\\boxed{12} \\boxed{13}", "12", 0.0),
        ("\\boxed{13} \\boxed{12}", "12", 1.0),
        ("the answer is 12", "12", 0.0),
    ],
)
def test_correctness_is_decided_by_math_equivalence_of_the_last_boxed_answer(reply, ground_truth, reward):
    score = score_reply(reply, ground_truth, format_reward=0.0, grader=shared_grader())
    assert score.reward == reward
    assert score.correct is (reward == 1.0)


def test_the_format_reward_is_added_only_when_a_boxed_answer_is_present():
    grader = shared_grader()
    assert score_reply("\\boxed{12}", "12", format_reward=0.1, grader=grader).reward == 1.1
    assert score_reply("\\boxed{13}", "12", format_reward=0.1, grader=grader).reward == 0.1
    assert score_reply("12", "12", format_reward=0.1, grader=grader).reward == 0.0
    assert score_reply("\\boxed{12", "12", format_reward=0.1, grader=grader).reward == 0.0


def test_a_reply_without_a_boxed_answer_is_not_graded():
    score = score_reply("12", "12", format_reward=0.0, grader=shared_grader())
    assert (score.correct, score.extracted_answer, score.verdict) == (False, None, None)


def test_grading_works_from_worker_threads_and_event_loops():
    grader = shared_grader()
    verdicts = []
    threads = [threading.Thread(target=lambda: verdicts.append(grader.grade("1/2", "0.5"))) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert verdicts == [Verdict.CORRECT] * 3

    async def grade_in_loop():
        return await asyncio.gather(*(asyncio.to_thread(grader.grade, "2", str(n)) for n in (1, 2)))

    assert asyncio.run(grade_in_loop()) == [Verdict.INCORRECT, Verdict.CORRECT]


def test_an_answer_that_cannot_be_compared_in_time_times_out_and_the_grader_recovers():
    grader = AnswerGrader(timeout_s=1.5)
    try:
        # sympy needs seconds here (the child gives up after 3 s); the parent kills it at 1.5 s.
        assert grader.grade("9^{9^{9}}", "3") is Verdict.TIMED_OUT
        assert grader.grade("3", "3") is Verdict.CORRECT
    finally:
        grader.close()


def test_a_non_positive_grading_timeout_is_rejected():
    with pytest.raises(ValueError, match="timeout_s must be > 0"):
        AnswerGrader(timeout_s=0)


def test_many_answers_graded_at_once_by_a_pool_of_two_workers_each_get_their_own_verdict():
    grader = AnswerGrader(max_workers=2)
    try:
        assert grader.grade("1", "1") is Verdict.CORRECT  # workers up and warm

        async def grade_many():
            return await asyncio.gather(*(asyncio.to_thread(grader.grade, str(n), "4") for n in range(6)))

        assert asyncio.run(grade_many()) == [Verdict.INCORRECT] * 4 + [Verdict.CORRECT, Verdict.INCORRECT]
    finally:
        grader.close()
