"""`python -m agentrl.viewer RUN_DIR... [--host H] [--port P]`: browse runs in a web browser."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from aiohttp import web

from agentrl.viewer.server import create_app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentrl.viewer", description=__doc__)
    parser.add_argument(
        "run_dirs", nargs="+", type=Path, help="run directories, or folders of them (e.g. runs/)"
    )
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (default: loopback only)")
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args(argv)
    missing = [str(path) for path in args.run_dirs if not path.is_dir()]
    if missing:
        print(
            f"error: not a directory: {', '.join(missing)} (pass a run dir such as runs/math)",
            file=sys.stderr,
        )
        return 2
    print(
        f"agentrl viewer on http://{args.host}:{args.port}/ serving {', '.join(map(str, args.run_dirs))}",
        flush=True,
    )
    web.run_app(create_app(args.run_dirs), host=args.host, port=args.port, print=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
