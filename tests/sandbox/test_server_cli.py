"""`python -m sandbox.run` and the HTTP server judge the same programs the same way (bwrap)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sandbox.client import SandboxClient
from sandbox.executor import Executor
from sandbox.server import create_app, serve
from sandbox.types import Language, RunLimits, RunRequest, RunResponse, Verdict

# (file name, source, stdin, expected verdict, expected stdout)
PROGRAMS = [
    ("echo.py", "print(input()[::-1])", "abc\n", Verdict.AC, "cba\n"),
    ("exit3.py", "import sys\nprint('before')\nsys.exit(3)", "", Verdict.RE, "before\n"),
    ("spin.py", "while True:\n    pass", "", Verdict.TLE, ""),
    (
        "sum.cpp",
        '#include <cstdio>\nint main(){int a,b; scanf("%d %d",&a,&b); printf("%d\\n",a+b);}',
        "2 3\n",
        Verdict.AC,
        "5\n",
    ),
    ("broken.cpp", "int main( {", "", Verdict.CE, None),
]
TIME_S = 1.0


@pytest.fixture
async def client() -> AsyncIterator[SandboxClient]:
    executor = await Executor.create(backend="bwrap", max_concurrency=2)
    async with serve(create_app(executor)) as url, SandboxClient(url) as sandbox_client:
        yield sandbox_client


async def _run_cli(program: Path, stdin_file: Path) -> RunResponse:
    argv = ["-m", "sandbox.run", str(program), "--stdin", str(stdin_file), "--timeout", str(TIME_S)]
    process = await asyncio.create_subprocess_exec(
        sys.executable, *argv, "--backend", "bwrap", "--json", stdout=asyncio.subprocess.PIPE
    )
    stdout, _ = await process.communicate()
    return RunResponse.model_validate_json(stdout)


@pytest.mark.parametrize("name,source,stdin,verdict,stdout", PROGRAMS, ids=[p[0] for p in PROGRAMS])
async def test_the_run_command_and_the_server_give_the_same_verdict(
    client: SandboxClient,
    tmp_path: Path,
    name: str,
    source: str,
    stdin: str,
    verdict: Verdict,
    stdout: str | None,
) -> None:
    program, stdin_file = tmp_path / name, tmp_path / "stdin.txt"
    program.write_text(source)
    stdin_file.write_text(stdin)
    language = Language.CPP if name.endswith(".cpp") else Language.PYTHON
    request = RunRequest(language=language, code=source, stdin=stdin, limits=RunLimits(time_s=TIME_S))

    from_cli, from_server = await asyncio.gather(_run_cli(program, stdin_file), client.run(request))

    assert (from_cli.verdict, from_server.verdict) == (verdict, verdict)
    if stdout is not None:
        assert from_cli.run is not None and from_server.run is not None
        assert (from_cli.run.stdout, from_server.run.stdout) == (stdout, stdout)
