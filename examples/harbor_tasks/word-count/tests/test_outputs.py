"""Checks of the word-count task's outputs; exits non-zero on the first failure."""

from pathlib import Path

poem = Path("/app/poem.txt").read_text().splitlines()
count = Path("/app/out/count.txt").read_text().strip()
assert count == str(sum(len(line.split()) for line in poem)), f"count.txt holds {count!r}"
reversed_lines = Path("/app/out/reversed.txt").read_text().splitlines()
assert reversed_lines == poem[::-1], "reversed.txt is not the poem's lines last first"
print("all checks passed")
