"""The docs stay true to the code: quoted commands load, links and named files exist, the config
reference is current.

Pages checked: README.md and every docs/*.md. A quoted command is any `python -m agentrl.train`
or `python -m agentrl.debug` (also under torchrun) in a code block or an inline code span; its
`group=preset` and `key=value` words must load as a config, as the command itself would load them.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from agentrl import train
from agentrl.config_docs import REGENERATE_COMMAND, config_reference
from agentrl.config_loader import ConfigError, load_config

REPO_ROOT = Path(__file__).resolve().parents[1]
PAGES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
ENTRY_POINTS = ("agentrl.train", "agentrl.debug")
SHELL_OPERATORS = {"|", "||", "&&", ";", "&"}
REPOSITORY_DIRS = ("agentrl", "sandbox", "envs", "examples", "benchmarks", "tests", "configs", "docs")
PACKAGES = ("agentrl", "sandbox", "envs", "examples", "benchmarks")

# Quoted commands that are not meant to load as written, each with the reason.
COMMAND_EXCEPTIONS: dict[str, str] = {}
# Quoted commands that show a config error, each with the error the page prints after `error: `.
COMMANDS_SHOWING_AN_ERROR = {
    "python -m agentrl.train actor.clip_ratio_hgh=0.3": (
        "unknown config key 'actor.clip_ratio_hgh'; did you mean 'actor.clip_ratio_high'?"
    ),
}
# Files the pages name that are not in the repository, each with the reason.
PATH_EXCEPTIONS = {"api_types.py": "SGLang's module, taken out of its wheel by tests/fetch_sglang_api.sh"}
# Dotted names the pages quote that are not modules, each with the reason.
MODULE_EXCEPTIONS = {"agentrl.envs": "the entry-point group that installed env packages register under"}

FENCE = re.compile(r"^ *(```|~~~)[^\n]*\n(.*?)^ *\1 *$", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`([^`]+)`")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
COMMAND = re.compile(
    rf"(?:python3? |torchrun )[^`]*?-m (?:{'|'.join(map(re.escape, ENTRY_POINTS))})(?=\s|$).*"
)
REPOSITORY_PATH = re.compile(rf"(?:{'|'.join(REPOSITORY_DIRS)})/[\w./*-]*")
DOTTED_NAME = re.compile(rf"(?:{'|'.join(PACKAGES)})(?:\.\w+)+(?::\w+)?")
RUN_MODULE = re.compile(rf"-m ((?:{'|'.join(PACKAGES)})(?:\.\w+)*)(?![\w.*])")

page_ids = pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(REPO_ROOT).as_posix())


def code_snippets(markdown: str) -> list[str]:
    """Every command-like piece of code in a page: fenced lines (continuations joined) and inline spans."""
    snippets = []
    for match in FENCE.finditer(markdown):
        snippets += match.group(2).replace("\\\n", " ").splitlines()
    return snippets + inline_spans(markdown)


def inline_spans(markdown: str) -> list[str]:
    """The page's inline code spans outside code blocks, whitespace (line breaks too) made single spaces."""
    return [" ".join(span.split()) for span in INLINE_CODE.findall(FENCE.sub("", markdown))]


# Quoted commands ----------------------------------------------------------------------------------


def quoted_commands(markdown: str) -> list[str]:
    """The snippets that run `python -m agentrl.train` or `agentrl.debug`, from the launcher on."""
    return [match.group(0) for snippet in code_snippets(markdown) if (match := COMMAND.search(snippet))]


def config_words(command: str) -> list[str]:
    """The `group=preset` / `key=value` words a command passes to load_config.

    Words before the module (env vars, torchrun's flags), options (`--row`, `--describe`) and their
    values, and whatever follows a shell operator or redirection are not config words. A word with
    `=` after `--describe` is one: the entry point reads it as an override.
    """
    words = shlex.split(command, comments=True)
    module_at = next(index for index, word in enumerate(words) if word in ENTRY_POINTS)
    selected = []
    for word in words[module_at + 1 :]:
        if word in SHELL_OPERATORS or word.startswith((">", "<", "2>")):
            break
        if "=" in word and not word.startswith("-"):
            selected.append(word)
    return selected


def page_commands() -> list[tuple[str, str]]:
    return [
        (page.relative_to(REPO_ROOT).as_posix(), command)
        for page in PAGES
        for command in dict.fromkeys(quoted_commands(page.read_text()))
    ]


def config_error(command: str) -> str | None:
    """Why the command's config words do not load, or None when they do."""
    try:
        load_config(config_words(command))
    except ConfigError as error:
        return str(error)
    return None


def test_the_docs_quote_commands_to_check():
    pages = {page for page, _ in page_commands()}
    assert {"README.md", "docs/training.md", "docs/debugging.md"} <= pages


@pytest.mark.parametrize(("page", "command"), page_commands())
def test_quoted_command_loads_as_a_config(page, command):
    if command in COMMAND_EXCEPTIONS:
        pytest.skip(COMMAND_EXCEPTIONS[command])
    error = config_error(command)
    if command in COMMANDS_SHOWING_AN_ERROR:
        shown = COMMANDS_SHOWING_AN_ERROR[command]
        assert f"error: {shown}" in (REPO_ROOT / page).read_text(), f"{page} no longer shows `{shown}`"
        assert error == shown, f"{page}: `{command}` now fails with {error!r}, not the error shown"
    else:
        assert error is None, f"{page}: `{command}` no longer loads: {error}"


def test_every_listed_command_is_still_quoted():
    quoted = {command for _, command in page_commands()}
    assert set(COMMAND_EXCEPTIONS) | set(COMMANDS_SHOWING_AN_ERROR) <= quoted


def test_a_command_with_an_unknown_key_is_reported():
    page = "Train with `python -m agentrl.train env=math actor.clip_ratio_hgh=0.3`.\n"
    [command] = quoted_commands(page)
    assert config_words(command) == ["env=math", "actor.clip_ratio_hgh=0.3"]
    assert "did you mean 'actor.clip_ratio_high'" in config_error(command)


def test_commands_are_found_in_blocks_spans_and_pipes():
    page = (
        "Run `python -m agentrl.train env=math\ntrainer.seed=1` then:\n\n"
        "```bash\n"
        "torchrun --nproc_per_node=2 -m agentrl.train rollout.n=4 \\\n"
        "    trainer.seed=2   # a comment=1\n"
        "$ printf 'say x\\n' | python -m agentrl.debug env=math --row 3 --describe env=custom 2>&1 | head\n"
        "python -m agentrl.engine.serve --port=1\n"
        "```\n"
    )
    assert [config_words(command) for command in quoted_commands(page)] == [
        ["rollout.n=4", "trainer.seed=2"],
        ["env=math", "env=custom"],
        ["env=math", "trainer.seed=1"],
    ]


# Links --------------------------------------------------------------------------------------------


def relative_links(markdown: str) -> list[str]:
    """Link and image targets outside code that are no URL: `file`, `file#anchor` or `#anchor`."""
    prose = INLINE_CODE.sub("", FENCE.sub("", markdown))
    return [target for target in LINK.findall(prose) if not re.match(r"[a-z][a-z0-9+.-]*:", target)]


def anchors(markdown: str) -> set[str]:
    """The anchors a Markdown renderer gives the page's headings (GitHub's rule, first of each name)."""
    headings = re.findall(r"^#{1,6} +(.+?) *$", FENCE.sub("", markdown), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


def broken_links(page: Path) -> list[str]:
    """The page's relative links whose file does not exist, or whose page has no such heading."""
    broken = []
    for target in relative_links(page.read_text()):
        path, _, anchor = target.partition("#")
        linked = (page.parent / path) if path else page
        missing_anchor = anchor and linked.suffix == ".md" and anchor not in anchors(linked.read_text())
        if not linked.exists() or missing_anchor:
            broken.append(target)
    return broken


@page_ids
def test_relative_links_point_to_existing_files_and_headings(page):
    broken = broken_links(page)
    assert broken == [], f"{page.relative_to(REPO_ROOT)} links to missing files or headings: {broken}"


def test_links_are_found_outside_code_only():
    page = (
        "See [training](docs/training.md#budgets), ![shot](img.png), [site](https://x.org).\n`[no](a.md)`\n"
    )
    assert relative_links(page) == ["docs/training.md#budgets", "img.png"]


def test_a_link_to_a_missing_file_or_heading_is_reported(tmp_path):
    (tmp_path / "guide.md").write_text("# Guide\n\n## The main job, measured\n")
    page = tmp_path / "index.md"
    page.write_text(
        "[ok](guide.md#the-main-job-measured) [gone](gone.md) [bad](guide.md#budgets) [me](#index)\n# Index\n"
    )
    assert broken_links(page) == ["gone.md", "guide.md#budgets"]


# Files and modules the pages name -----------------------------------------------------------------


def missing_paths(markdown: str) -> list[str]:
    """Quoted repository paths (`agentrl/engine/protocol.py`, `tests/rollout/test_env_faults*.py`)
    that match nothing, and quoted module file names (`pending_step.py`) no repository file has."""
    missing = []
    for quoted in sorted(set(inline_spans(markdown)) - set(PATH_EXCEPTIONS)):
        if REPOSITORY_PATH.fullmatch(quoted):
            found = any(REPO_ROOT.glob(quoted))
        elif re.fullmatch(r"\w+\.py", quoted):
            found = any(any((REPO_ROOT / top).rglob(quoted)) for top in REPOSITORY_DIRS)
        else:
            continue
        if not found:
            missing.append(quoted)
    return missing


@page_ids
def test_quoted_repository_paths_exist(page):
    missing = missing_paths(page.read_text())
    assert missing == [], f"{page.relative_to(REPO_ROOT)} names files that do not exist: {missing}"


def test_a_moved_file_is_reported():
    page = (
        "`agentrl/engine/protocol.py`, `agentrl/nowhere.py`, `pending_step_gone.py`, `tests/rollout/*.py`\n"
    )
    assert missing_paths(page) == ["agentrl/nowhere.py", "pending_step_gone.py"]


def quoted_modules(markdown: str) -> list[str]:
    """Dotted names quoted as inline code (`agentrl.env.TextEnv`, `envs.math.synthetic:generate`),
    and the modules of `python -m` commands in code, written `module -m`."""
    names = {span for span in inline_spans(markdown) if DOTTED_NAME.fullmatch(span)}
    for snippet in code_snippets(markdown):
        names |= {f"{module} -m" for module in RUN_MODULE.findall(snippet)}
    return sorted(names - set(MODULE_EXCEPTIONS))


def resolves(name: str) -> bool:
    """Whether a quoted dotted name names a module of the repository, or a name its module defines.

    `x -m` (a `python -m x` module) must be a module file or a package with __main__.py. Otherwise
    the longest prefix that is a module or package must be the whole name, or mention the next part
    as a word (a definition, an import or a lazy export); anything past that part is an attribute
    and is not checked.
    """
    if name.endswith(" -m"):
        path = REPO_ROOT.joinpath(*name.removesuffix(" -m").split("."))
        return path.with_suffix(".py").is_file() or (path / "__main__.py").is_file()
    parts = name.replace(":", ".").split(".")
    for length in range(len(parts), 0, -1):
        path = REPO_ROOT.joinpath(*parts[:length])
        module = path.with_suffix(".py")
        if module.is_file() or path.is_dir():
            if length == len(parts):
                return True
            source = module if module.is_file() else path / "__init__.py"
            return source.is_file() and re.search(rf"\b{parts[length]}\b", source.read_text()) is not None
    return False


@page_ids
def test_quoted_modules_exist(page):
    missing = [name for name in quoted_modules(page.read_text()) if not resolves(name)]
    assert missing == [], f"{page.relative_to(REPO_ROOT)} names modules that do not exist: {missing}"


def test_a_moved_python_module_is_reported():
    page = (
        "`agentrl.env.TextEnv`, `agentrl.config.Config.warnings`, `envs.math.synthetic:generate`, "
        "`agentrl.nowhere.Thing`, `agentrl.env.NoSuchName`\n\n```bash\npython -m agentrl.train\n"
        "python -m agentrl.nowhere x=1\npython -m sandbox.*\n```\n"
    )
    assert [name for name in quoted_modules(page) if not resolves(name)] == [
        "agentrl.env.NoSuchName",
        "agentrl.nowhere -m",
        "agentrl.nowhere.Thing",
    ]


# The generated config reference ------------------------------------------------------------------


def test_config_reference_is_current():
    page = REPO_ROOT / "docs" / "config_reference.md"
    assert page.read_text() == config_reference(), (
        f"docs/config_reference.md differs from the schema; regenerate it with: {REGENERATE_COMMAND}"
    )


def test_config_reference_holds_what_describe_prints():
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert train.main(["--describe"]) == 0
    blocks = re.findall(r"^```text\n(.*?)^```$", config_reference(), re.MULTILINE | re.DOTALL)
    assert "".join(blocks).splitlines() == printed.getvalue().splitlines()
