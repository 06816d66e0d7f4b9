"""How each language is compiled and run inside the jail (one entry per language).

All paths are inside the jail, where the session's work directory is mounted at /work.
"""

from __future__ import annotations

from dataclasses import dataclass

from sandbox.types import Language

PYTHON_ARGV = ("python3", "-I", "-B")  # isolated: no env vars, no user site, no script dir on sys.path


@dataclass(frozen=True)
class LanguageSpec:
    """A language: where the source goes, how to compile it (None: interpreted) and how to run it."""

    language: Language
    source_file: str
    compile_argv: tuple[str, ...] | None
    run_argv: tuple[str, ...]
    supports_harness: bool  # call and assert tests need the Python harness


LANGUAGES: dict[Language, LanguageSpec] = {
    Language.PYTHON: LanguageSpec(
        language=Language.PYTHON,
        source_file="main.py",
        compile_argv=None,
        run_argv=(*PYTHON_ARGV, "main.py"),
        supports_harness=True,
    ),
    Language.CPP: LanguageSpec(
        language=Language.CPP,
        source_file="main.cpp",
        compile_argv=("g++", "-O2", "-std=c++17", "-pipe", "-o", "main", "main.cpp"),
        run_argv=("./main",),
        supports_harness=False,
    ),
}

EXTENSIONS: dict[str, Language] = {".py": Language.PYTHON, ".cpp": Language.CPP, ".cc": Language.CPP}


def language_spec(language: Language) -> LanguageSpec:
    return LANGUAGES[language]


def language_from_path(path: str) -> Language:
    """Infer the language from a file name's extension."""
    for extension, language in EXTENSIONS.items():
        if path.endswith(extension):
            return language
    known = ", ".join(EXTENSIONS)
    raise ValueError(f"cannot infer the language of {path!r} (known extensions: {known}); pass --language")
