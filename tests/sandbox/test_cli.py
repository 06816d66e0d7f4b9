"""The two command lines, end to end on the bwrap backend: sandbox.run and sandbox.eval (HumanEval format)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from sandbox import eval as sandbox_eval
from sandbox import run as sandbox_run

DATA = Path(__file__).parent / "data"


def test_run_prints_the_response_as_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    program, stdin = tmp_path / "reverse.py", tmp_path / "input.txt"
    program.write_text("print(input()[::-1])")
    stdin.write_text("abc\n")
    exit_code = sandbox_run.main([str(program), "--stdin", str(stdin), "--backend", "bwrap", "--json"])
    response = json.loads(capsys.readouterr().out)
    assert (exit_code, response["verdict"], response["run"]["stdout"]) == (0, "AC", "cba\n")


def test_run_compiles_cpp_inferred_from_the_extension(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    program = tmp_path / "hello.cpp"
    program.write_text('#include <cstdio>\nint main() { std::puts("hi"); return 3; }')
    exit_code = sandbox_run.main([str(program), "--backend", "bwrap", "--timeout", "2"])
    out = capsys.readouterr().out
    assert exit_code == 1
    assert out.splitlines()[0] == "verdict: RE"
    assert "--- stdout ---\nhi\n" in out


def test_run_names_an_unknown_extension(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    program = tmp_path / "main.rb"
    program.write_text("puts 1")
    with pytest.raises(SystemExit):
        sandbox_run.main([str(program), "--backend", "bwrap"])
    assert "cannot infer the language of 'main.rb'" in capsys.readouterr().err


def test_run_names_a_stdin_file_that_does_not_exist(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    program = tmp_path / "main.py"
    program.write_text("print(input())")
    with pytest.raises(SystemExit) as exited:
        sandbox_run.main([str(program), "--stdin", str(tmp_path / "input.txt"), "--backend", "bwrap"])
    assert exited.value.code == 2
    assert f"stdin file '{tmp_path / 'input.txt'}' does not exist" in capsys.readouterr().err


@pytest.fixture
def samples(tmp_path: Path) -> Path:
    shutil.copy(DATA / "humaneval_samples.jsonl", tmp_path / "samples.jsonl")
    return tmp_path / "samples.jsonl"


def test_eval_prints_pass_at_k_and_writes_per_sample_results(
    samples: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    problems = DATA / "humaneval_problems.jsonl"
    argv = ["--problems", str(problems), "--samples", str(samples), "--k", "1,2", "--backend", "bwrap"]
    assert sandbox_eval.main(argv) == 0
    out, err = capsys.readouterr()
    pass_at = json.loads(out)
    assert pass_at == pytest.approx({"pass@1": 0.5, "pass@2": 5 / 6}, abs=1e-12)
    results_path = samples.parent / "samples.jsonl_results.jsonl"
    # Off a terminal (as here, and in a log) no progress bar: just what ran and where the results are.
    assert err.splitlines() == [
        "judging 6 samples on the bwrap backend",
        f"per-sample results: {results_path}",
    ]
    rows = [json.loads(line) for line in results_path.read_text().splitlines()]
    assert [(row["task_id"], row["passed"], row["result"]) for row in rows] == [
        ("Tiny/0", True, "AC"),
        ("Tiny/0", False, "WA"),
        ("Tiny/0", False, "RE"),  # sys.exit(0) before check() ran
        ("Tiny/1", True, "AC"),
        ("Tiny/1", True, "AC"),
        ("Tiny/1", False, "WA"),
    ]


def test_eval_with_backend_auto_says_which_backend_it_chose(
    samples: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    problems = DATA / "humaneval_problems.jsonl"
    assert sandbox_eval.main(["--problems", str(problems), "--samples", str(samples), "--k", "1"]) == 0
    first_line = capsys.readouterr().err.splitlines()[0]
    assert re.fullmatch(
        r"judging 6 samples on the (docker|bwrap) backend \(--backend auto chose it\)", first_line
    )


def test_eval_gives_no_credit_to_wrong_samples_that_shadow_the_builtins_the_test_uses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    problem = {
        "task_id": "Tiny/root",
        "prompt": "def root(x: float) -> float:\n",
        "entry_point": "root",
        "test": "def check(candidate):\n    for x in range(1, 4):\n        assert abs(candidate(x * x) - x) < 1e-9\n",
    }
    completions = [
        "    return 0.0\n\n\ndef abs(x):\n    return 0\n",
        "    return x\n\n\ndef range(*args):\n    return []\n",
    ]
    (tmp_path / "problems.jsonl").write_text(json.dumps(problem) + "\n")
    samples = tmp_path / "samples.jsonl"
    samples.write_text(
        "".join(json.dumps({"task_id": "Tiny/root", "completion": c}) + "\n" for c in completions)
    )
    argv = [
        "--problems",
        str(tmp_path / "problems.jsonl"),
        "--samples",
        str(samples),
        "--k",
        "1",
        "--backend",
        "bwrap",
    ]
    assert sandbox_eval.main(argv) == 0
    assert json.loads(capsys.readouterr().out) == {"pass@1": 0.0}
    rows = [json.loads(line) for line in (tmp_path / "samples.jsonl_results.jsonl").read_text().splitlines()]
    assert [(row["passed"], row["result"]) for row in rows] == [(False, "WA"), (False, "WA")]


@pytest.mark.parametrize(
    ("samples_text", "error"),
    [
        (
            '{"task_id": "Tiny/0", "completion": "x"}\n{"task_id": "Tiny/0"\n',
            "samples.jsonl:2: not valid JSON",
        ),
        ('{"task_id": "Tiny/0"}\n', "samples.jsonl:1: not a Sample row (completion: Field required)"),
        ('\n{"task_id": "Tiny/9", "completion": "x"}\n', "samples.jsonl:2: unknown task_id 'Tiny/9'"),
    ],
    ids=["malformed_json", "missing_field", "unknown_task_id"],
)
def test_eval_names_the_bad_line(
    samples: Path, samples_text: str, error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    samples.write_text(samples_text)
    argv = [
        "--problems",
        str(DATA / "humaneval_problems.jsonl"),
        "--samples",
        str(samples),
        "--backend",
        "bwrap",
    ]
    with pytest.raises(SystemExit):
        sandbox_eval.main(argv)
    assert error in capsys.readouterr().err
