"""`python -m sandbox.eval` with its defaults reproduces human-eval's own sanity check.

The data is human-eval's example problem and its six example samples as openai/human-eval
ships them (data/example_problem.jsonl, data/example_samples.jsonl at commit 6d43fb9, MIT).
Its README says they "should yield 0.5 pass@1": the sample that sleeps 10 s only fails under
human-eval's 3 s limit.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sandbox import eval as sandbox_eval

DATA = Path(__file__).parent / "data"


@pytest.mark.parametrize("backend", ["bwrap", "docker"])
def test_human_evals_example_samples_score_its_documented_pass_at_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], backend: str
) -> None:
    samples = tmp_path / "example_samples.jsonl"
    shutil.copy(DATA / "humaneval_example_samples.jsonl", samples)
    problems = DATA / "humaneval_example_problem.jsonl"
    assert (
        sandbox_eval.main(["--problems", str(problems), "--samples", str(samples), "--backend", backend]) == 0
    )
    assert json.loads(capsys.readouterr().out) == pytest.approx({"pass@1": 0.5}, abs=1e-12)
    rows = [
        json.loads(line)
        for line in (tmp_path / "example_samples.jsonl_results.jsonl").read_text().splitlines()
    ]
    assert [(row["passed"], row["result"]) for row in rows] == [
        (False, "RE"),  # runs `rm -rf tmp` as a program name: FileNotFoundError
        (False, "TLE"),  # sleeps 10 s
        (False, "RE"),  # input() at end of file
        (True, "AC"),
        (True, "AC"),
        (True, "AC"),
    ]
