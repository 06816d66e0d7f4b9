"""Data stage of the terminal env: Harbor-format task folders as dataset rows.

A task folder holds `instruction.md`, `task.toml` (`[verifier] timeout_sec`, `[agent]
timeout_sec`; the rest is metadata), `environment/Dockerfile` with its build context,
`tests/test.sh` (+ its files) which writes the reward to `/logs/verifier/reward.txt` (a number)
or `reward.json` (`{"reward": x, ...}`), and optionally `solution/solve.sh`.

Offline, no image is built: every session runs the sandbox's own image. Of the Dockerfile,
`WORKDIR` (must be /app, mapped to /work), `COPY`/`ADD` of files from the build context (placed
into the session), `RUN` (run in the session, as the session's user and without network, before
the agent starts) and `ENV` (exported for every command) are carried out; `FROM`, `CMD`,
`ENTRYPOINT`, `EXPOSE`, `LABEL`, `ARG`, `USER` and `SHELL` are ignored; anything else, `ADD`
of a URL and `COPY --from` are refused with an error naming the folder and the line. Harbor's
fixed paths are mapped to the session's (`envs.terminal.task.map_paths`).

    python -m agentrl.train env=terminal data.generator=envs.terminal.harbor:generate \
        data.generator_kwargs.task_dir=examples/harbor_tasks
"""

from __future__ import annotations

import random
import shlex
import tomllib
from pathlib import Path
from typing import Any

from envs.terminal.task import TerminalTask, encode, map_paths, prompt_text

DATA_SOURCE = "harbor"
IGNORED = {
    "FROM",
    "CMD",
    "ENTRYPOINT",
    "EXPOSE",
    "LABEL",
    "ARG",
    "USER",
    "SHELL",
    "MAINTAINER",
    "HEALTHCHECK",
    "STOPSIGNAL",
    "VOLUME",
    "ONBUILD",
}
HARBOR_WORKDIR = "/app"


def load_task(folder: str | Path) -> TerminalTask:
    """The task in one Harbor folder; ValueError names the folder and what is missing or unsupported."""
    folder = Path(folder)
    for required in ("instruction.md", "tests/test.sh"):
        if not (folder / required).is_file():
            raise ValueError(f"Harbor task {folder}: {required} is missing (see docs/terminal_env.md)")
    config = _read_toml(folder / "task.toml") if (folder / "task.toml").is_file() else {}
    files: dict[str, str] = {}
    setup: list[str] = []
    env: dict[str, str] = {}
    dockerfile = folder / "environment" / "Dockerfile"
    if dockerfile.is_file():
        _apply_dockerfile(folder, dockerfile, files, setup, env)
    verifier_timeout = float(config.get("verifier", {}).get("timeout_sec", 60.0))
    return TerminalTask(
        task_id=str(config.get("task", {}).get("name") or folder.name),
        instruction=map_paths((folder / "instruction.md").read_text()).strip(),
        files=files,
        setup=setup,
        env=env,
        tests=_tree(folder / "tests", mapped=True),
        solution=_tree(folder / "solution", mapped=True) if (folder / "solution").is_dir() else {},
        verifier_timeout_s=verifier_timeout,
    )


def load_tasks(task_dir: str | Path) -> list[TerminalTask]:
    """Every task folder under `task_dir` (a folder with instruction.md), sorted by name."""
    root = Path(task_dir)
    if (root / "instruction.md").is_file():
        return [load_task(root)]
    folders = (
        sorted(path for path in root.iterdir() if (path / "instruction.md").is_file())
        if root.is_dir()
        else []
    )
    if not folders:
        raise ValueError(
            f"task_dir {str(task_dir)!r} holds no Harbor task folder (a folder with instruction.md)"
        )
    return [load_task(folder) for folder in folders]


def task_row(task: TerminalTask, index: int, split: str) -> dict[str, Any]:
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": prompt_text(task.instruction)}],
        "reward_model": {"style": "rule", "ground_truth": task.model_dump_json()},
        "extra_info": {"index": index, "split": split, "task": task.task_id},
    }


def generate(num_rows: int, seed: int, split: str = "train", task_dir: str = "") -> list[dict[str, Any]]:
    """`num_rows` rows drawn from the folder's tasks in a seeded shuffled cycle."""
    tasks = load_tasks(task_dir)
    order: list[TerminalTask] = []
    rng = random.Random(f"harbor-{split}-{seed}")
    while len(order) < num_rows:
        cycle = list(tasks)
        rng.shuffle(cycle)
        order += cycle
    return [task_row(task, index, split) for index, task in enumerate(order[:num_rows])]


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"{path}: invalid TOML ({error})") from None


def _tree(directory: Path, mapped: bool) -> dict[str, str]:
    """Every file under `directory`, by relative path; text files get Harbor's paths mapped."""
    files = {}
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            data = path.read_bytes()
            if mapped:
                try:
                    data = map_paths(data.decode()).encode()
                except UnicodeDecodeError:
                    pass  # binary: copied as it is
            files[path.relative_to(directory).as_posix()] = encode(data)
    return files


def _instructions(dockerfile: Path) -> list[tuple[int, str, str]]:
    """(line number, KEYWORD, arguments) per instruction, continuation lines joined, comments dropped."""
    instructions, pending, start = [], "", 0
    for number, line in enumerate(dockerfile.read_text().splitlines(), start=1):
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        start = start if pending else number
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        keyword, _, arguments = (pending + stripped).partition(" ")
        instructions.append((start, keyword.upper(), arguments.strip()))
        pending = ""
    return instructions


def _apply_dockerfile(
    folder: Path, dockerfile: Path, files: dict[str, str], setup: list[str], env: dict[str, str]
) -> None:
    context = folder / "environment"
    workdir = HARBOR_WORKDIR
    for number, keyword, arguments in _instructions(dockerfile):
        where = f"{dockerfile}:{number}"
        if keyword in IGNORED:
            continue
        if keyword == "WORKDIR":
            if arguments != HARBOR_WORKDIR:
                raise ValueError(
                    f"{where}: WORKDIR {arguments} is not supported; tasks work in {HARBOR_WORKDIR} (the session's /work)"
                )
        elif keyword == "ENV":
            env.update(_env_pairs(arguments, where))
        elif keyword == "RUN":
            setup.append(map_paths(arguments))
        elif keyword in ("COPY", "ADD"):
            _copy(context, arguments, workdir, files, where)
        else:
            raise ValueError(
                f"{where}: Dockerfile instruction {keyword} is not supported offline (see docs/terminal_env.md)"
            )


def _env_pairs(arguments: str, where: str) -> dict[str, str]:
    words = shlex.split(arguments)
    if len(words) == 2 and "=" not in words[0]:
        return {words[0]: map_paths(words[1])}
    if not all("=" in word for word in words):
        raise ValueError(f"{where}: ENV must be `ENV NAME=value ...` or `ENV NAME value`, got {arguments!r}")
    return {name: map_paths(value) for name, _, value in (word.partition("=") for word in words)}


def _copy(context: Path, arguments: str, workdir: str, files: dict[str, str], where: str) -> None:
    words = shlex.split(arguments)
    if any(word.startswith("--") for word in words) or len(words) < 2:
        raise ValueError(
            f"{where}: only `COPY <source>... <destination>` from the build context is supported, got {arguments!r}"
        )
    *sources, destination = words
    if not destination.startswith("/"):
        destination = f"{workdir}/{destination}"
    for source in sources:
        if "://" in source:
            raise ValueError(f"{where}: ADD of a URL needs the network; put the file in environment/")
        path = (context / source).resolve()
        if not path.is_relative_to(context.resolve()) or not path.exists():
            raise ValueError(f"{where}: {source} is not a file or folder of environment/")
        if path.is_dir():
            for relative, data in _tree(path, mapped=False).items():
                files[map_paths(f"{destination.rstrip('/')}/{relative}")] = data
        else:
            target = (
                f"{destination.rstrip('/')}/{path.name}"
                if destination.endswith("/") or len(sources) > 1
                else destination
            )
            files[map_paths(target)] = encode(path.read_bytes())
