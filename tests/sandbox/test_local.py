"""The unsafe-local backend: no jail, a loud warning, and the same judging as the real backends."""

from __future__ import annotations

import pytest

from sandbox.executor import Executor
from sandbox.types import AssertTest, CallTest, Language, RunLimits, RunRequest, StdioTest, Verdict

LIMITS = RunLimits(time_s=2, memory_mb=256)


async def test_unsafe_local_warns_loudly_and_judges_all_test_kinds(
    capsys: pytest.CaptureFixture[str],
) -> None:
    async with await Executor.create("unsafe-local", max_concurrency=1) as executor:
        python = await executor.run(
            RunRequest(
                language=Language.PYTHON,
                code="def double(x):\n    return 2 * x",
                entry_point="double",
                tests=[CallTest(args=[2], expected=4), AssertTest(code="assert double(1) == 3")],
                limits=LIMITS,
            )
        )
        cpp = await executor.run(
            RunRequest(
                language=Language.CPP,
                code='#include <cstdio>\nint main() { std::puts("ok"); }',
                tests=[StdioTest(expected_stdout="ok\n")],
                limits=LIMITS,
            )
        )
    assert "UNJAILED" in capsys.readouterr().err
    assert [test.verdict for test in python.tests] == [Verdict.AC, Verdict.WA]
    assert (cpp.verdict, cpp.compile.verdict) == (Verdict.AC, Verdict.AC)


async def test_unknown_backend_names_list_the_choices() -> None:
    with pytest.raises(
        ValueError, match=r"unknown sandbox backend 'bwrapp'; choose one of \['auto', 'docker'"
    ):
        await Executor.create("bwrapp")
