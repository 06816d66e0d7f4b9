"""Inference stage, served: `python -m agentrl.engine.serve --model PATH` runs the built-in engine
behind the subset of SGLang's native HTTP protocol that `engine=sglang` speaks (`http_server`).

    python -m agentrl.engine.serve --model PATH [--host 127.0.0.1] [--port 30000] [--device auto]
                                   [--strict-sglang] [--enable-deterministic-inference]

It prints `agentrl.engine.serve listening on http://HOST:PORT` once it accepts requests (with
`--port 0` the port is a free one, read it from that line). Off loopback it needs `--api-key`,
because `/update_weights_from_disk` loads whatever path it is given.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import signal
import sys

from aiohttp import web

from agentrl.devices import resolve_device
from agentrl.engine.builtin.model.model_setup import resolve_dtype
from agentrl.engine.config import ModelConfig, add_engine_flags, engine_config_from_flags
from agentrl.engine.factory import build_engine
from agentrl.engine.serve.http_server import ServedEngine, build_app
from agentrl.engine.serve.weight_receiver import add_weight_transfer_routes
from agentrl.model_path import load_tokenizer, resolve_model_path

LISTENING = "agentrl.engine.serve listening on"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m agentrl.engine.serve", description=__doc__.split("\n\n")[0]
    )
    # SGLang's spellings are accepted too, so the launcher can start either server with one command.
    parser.add_argument(
        "--model", "--model-path", dest="model", required=True,
        help="HF checkpoint directory; 'tiny' = the bundled policy",
    )  # fmt: skip
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    parser.add_argument("--port", type=int, default=30000, help="port to bind; 0 = a free port")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    add_engine_flags(parser)  # --device, --max-batch-size, ...: the engine section's built-in knobs
    parser.add_argument(
        "--seed", "--random-seed", dest="seed", type=int, default=0,
        help="seeds requests that carry no sampling_seed",
    )  # fmt: skip
    parser.add_argument("--weight-version", type=int, default=0, help="policy version served at start")
    parser.add_argument("--api-key", default=None, help="required off loopback: clients send 'Bearer KEY'")
    parser.add_argument(
        "--strict-sglang", action="store_true",
        help="also keep SGLang's runtime rules (no /flush_cache while requests run, sampling_seed read "
        "only with --enable-deterministic-inference, ...), so a client tested here works against SGLang",
    )  # fmt: skip
    parser.add_argument(
        "--enable-deterministic-inference", dest="deterministic", action="store_true",
        help="SGLang's flag: requests without a sampling_seed sample with seed 42 (with --strict-sglang, "
        "sampling_seed is read only with this flag)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if not is_loopback(args.host) and args.api_key is None:
        parser.error(f"--host {args.host} is reachable from other machines; pass --api-key KEY as well")
    return args


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def build_served(args: argparse.Namespace) -> ServedEngine:
    """The engine the flags ask for, built by `build_engine`, with what the routes need."""
    model_path = resolve_model_path(args.model, setting="--model")
    device = resolve_device(args.device, setting="--device")
    tokenizer = load_tokenizer(model_path, setting="--model")
    engine = build_engine(
        ModelConfig(path=model_path, dtype=args.dtype),
        engine_config_from_flags(args).model_copy(update={"device": device}),
        seed=args.seed,
        policy_version=args.weight_version,
    )
    return ServedEngine(
        engine, tokenizer, model_path, resolve_dtype(args.dtype), policy_version=args.weight_version,
        api_key=args.api_key, strict=args.strict_sglang, deterministic=args.deterministic,
    )  # fmt: skip


async def serve(args: argparse.Namespace) -> None:
    """Load the engine, serve until SIGINT/SIGTERM, then close the engine."""
    served = build_served(args)
    app = build_app(served)
    add_weight_transfer_routes(app)  # engine.weight_sync=distributed
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, args.host, args.port)
        await site.start()
        host, port = runner.addresses[0][:2]
        host = f"[{host}]" if ":" in host else host  # an IPv6 address in a URL
        where = f"model {served.model_path}, device {served.engine.device}"
        print(f"{LISTENING} http://{host}:{port} ({where})", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        await stop.wait()
    finally:
        await runner.cleanup()
        await served.engine.close()


def main(argv: list[str] | None = None) -> int:
    try:
        asyncio.run(serve(parse_args(argv)))
    except ValueError as error:  # a model that cannot load
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
