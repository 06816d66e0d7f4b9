"""Entry point: `python -m agentrl.gateway [--host H --port P --api-key K] [key.sub=value ...]`.

Serves the configured policy (model.*, engine.*; budgets from rollout.*) to agents outside a
training run. `POST /sessions` with the API key opens a session and answers its base URL; each
session's calls are recorded and served at `GET /s/{session}/record`. The client's sampling
settings apply (no training distribution to keep).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from agentrl.config_loader import ConfigError, load_config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentrl.gateway", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "overrides", nargs="*", help="config overrides, e.g. model.path=... engine.device=cpu"
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to bind; beyond loopback needs --api-key"
    )
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--api-key", default=os.environ.get("AGENTRL_GATEWAY_API_KEY"),
                        help="key clients send (default: $AGENTRL_GATEWAY_API_KEY, else a random one, printed)")  # fmt: skip
    parser.add_argument("--max-concurrent-calls", type=int, default=64)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        config = load_config(args.overrides)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    try:
        asyncio.run(serve(config, args))
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


async def serve(config, args: argparse.Namespace) -> None:
    from agentrl.engine.factory import build_engine
    from agentrl.gateway.server import Gateway
    from agentrl.gateway.turn_format import TurnFormat
    from agentrl.model_path import load_tokenizer, resolve_model_path
    from agentrl.renderers import build_renderer

    gateway = Gateway(
        build_engine(config.model, config.engine, seed=config.trainer.seed),
        TurnFormat(build_renderer(load_tokenizer(resolve_model_path(config.model.path)), config.model.renderer)),
        host=args.host, port=args.port, api_key=args.api_key, max_concurrent_calls=args.max_concurrent_calls,
        session_budgets=config.rollout.budgets(),
    )  # fmt: skip
    async with gateway:
        key = "the key given" if args.api_key else f"API key {gateway.api_key}"
        print(f"gateway on {gateway.url} ({key}); POST {gateway.url}/sessions opens a session", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    sys.exit(main())
