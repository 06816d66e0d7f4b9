"""Which fenced block of a reply is its program: the last tagged for the language, else the last untagged."""

import pytest

from agentrl.parsing import extract_program
from sandbox.types import Language


def block(tag, body):
    return f"```{tag}\n{body}\n```"


@pytest.mark.parametrize(
    ("reply", "program"),
    [
        (block("python", "a = 1"), "a = 1\n"),
        (block("", "a = 1"), "a = 1\n"),
        (block("python", "a = 1") + "\nIt prints:\n" + block("", "1"), "a = 1\n"),
        (block("", "a = 0") + "\n" + block("python", "a = 1"), "a = 1\n"),
        (
            block("python", "a = 1") + "\n" + block("text", "a = 2") + block("bash", "python main.py"),
            "a = 1\n",
        ),
        (block("python", "draft = 1") + "\nFixed:\n" + block("py", "a = 1"), "a = 1\n"),
        (block("Python3", "a = 1"), "a = 1\n"),
        (block("python", "a = 1") + "\n```python\nb = 2\n", "a = 1\n"),
        (block("python", "a = 1") + "\n" + block("python", "  "), "a = 1\n"),
        (block("text", "a = 1"), None),
        ("```python\na = 1\n", None),
        ("a = 1", None),
        (block("python", " \n "), None),
    ],
    ids=[
        "python",
        "untagged",
        "python then untagged output",
        "untagged then python",
        "python then other languages",
        "draft then fix",
        "tag case and python3",
        "python then an unclosed fence",
        "python then a blank block",
        "another language only",
        "unclosed only",
        "no fence",
        "blank only",
    ],
)
def test_the_program_of_a_python_reply(reply, program):
    assert extract_program(reply, Language.PYTHON) == program


def test_a_cpp_task_takes_the_cpp_block_not_the_python_one():
    reply = block("cpp", "int main() {}") + "\n" + block("python", "print(1)")
    assert extract_program(reply, Language.CPP) == "int main() {}\n"
    assert extract_program(reply, Language.PYTHON) == "print(1)\n"
