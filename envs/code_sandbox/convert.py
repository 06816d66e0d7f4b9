"""Data stage of the code env: convert a public code dataset file into training rows.

    python -m envs.code_sandbox.convert --format mbpp mbpp.jsonl data/mbpp.parquet

The output (`.parquet` or `.jsonl`) is what `data.train_files` / `data.val_files` take.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pyarrow
from pyarrow import parquet

from envs.code_sandbox.loaders import LOADERS


def write_rows(rows: list[dict], path: Path) -> None:
    """Rows to `.jsonl` (one object a line) or `.parquet`."""
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    elif path.suffix == ".parquet":
        parquet.write_table(pyarrow.Table.from_pylist(rows), path)
    else:
        raise ValueError(f"{path}: write .jsonl or .parquet, got {path.suffix!r}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Convert a code dataset into agentrl rows for env=code_sandbox."
    )
    parser.add_argument("--format", required=True, choices=sorted(LOADERS), help="layout of the input file")
    parser.add_argument("input", type=Path)
    parser.add_argument("output", type=Path, help="a .jsonl or .parquet file to write")
    args = parser.parse_args(argv)
    try:
        rows = LOADERS[args.format](args.input)
        write_rows(rows, args.output)
    except ValueError as error:
        parser.exit(2, f"error: {error}\n")
    print(f"wrote {len(rows)} rows to {args.output}")


if __name__ == "__main__":
    main()
