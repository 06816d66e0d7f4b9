"""Inference stage, set-up: start an SGLang server for `engine.launch=true`, or check one to attach to.

`LaunchedServer.start` runs `python -m sglang.launch_server --model-path ... --port ...` in its
own process group (SGLang forks scheduler and detokenizer processes), waits until `/health`
answers 200 and stops the whole group on `stop()` or at interpreter exit. Its log goes to a file
whose last lines are quoted when the server dies during start-up.

The checks here are synchronous on purpose: they run while the trainer is being built, before
any event loop exists, and a bad URL or a server of the wrong version should fail right there.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import weakref
from dataclasses import dataclass
from pathlib import Path

from agentrl.engine.remote.sglang_protocol import EngineRequestError, parse_version

SGLANG_MODULE = "sglang.launch_server"
HEALTH_POLL_S = 0.5
STOP_GRACE_S = 30.0


def probe_server(url: str, *, timeout_s: float, api_key: str | None = None) -> int:
    """The policy version a running server reports (`GET /model_info`); raises EngineRequestError."""
    # Not /get_model_info: SGLang 0.5.23 answers it too but logs a deprecation warning per call.
    request = urllib.request.Request(f"{url.rstrip('/')}/model_info", headers=auth_headers(api_key))
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            info = json.load(response)
    except (urllib.error.URLError, OSError, ValueError) as error:
        raise EngineRequestError(f"no SGLang-protocol server answers at engine.url={url}: {error}") from None
    return parse_version(info.get("weight_version"))


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _stop_group(process: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM the server's process group, then SIGKILL what is left after `grace_s`."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    except ProcessLookupError:  # it exited between the poll and the signal
        pass


@dataclass
class LaunchedServer:
    """An SGLang-protocol server process this trainer started and must stop."""

    process: subprocess.Popen
    url: str
    log_path: Path

    @classmethod
    def start(
        cls,
        model_path: str,
        *,
        port: int,
        dtype: str,
        seed: int,
        deterministic: bool = False,
        extra_args: list[str],
        startup_timeout_s: float,
        module: str = SGLANG_MODULE,
    ) -> LaunchedServer:
        """Launch `python -m <module>` with SGLang's flags and wait for its /health.

        `module` is SGLang's server unless a caller names another that takes the same flags
        (`agentrl.engine.serve` does, which is how the launcher is tested without SGLang).
        `deterministic` adds `--enable-deterministic-inference`, without which SGLang ignores
        every request's `sampling_seed`.
        """
        if importlib.util.find_spec(module.split(".")[0]) is None:
            raise ValueError(
                f"engine.launch=true runs `python -m {module}`, but {module.split('.')[0]!r} is not installed "
                "here; install SGLang, or start a server yourself and set engine.url"
            )
        port = port or free_port()
        command = [
            sys.executable, "-m", module, "--model-path", model_path, "--host", "127.0.0.1",
            "--port", str(port), "--dtype", dtype, "--random-seed", str(seed),
            "--weight-version", "0",  # agentrl's policy versions are decimal step numbers
            *(["--enable-deterministic-inference"] if deterministic else []),
            *extra_args,
        ]  # fmt: skip
        log_path = Path(tempfile.mkdtemp(prefix="agentrl-sglang-")) / "server.log"
        print(f"launching {' '.join(command)} (log: {log_path})", flush=True)
        with open(log_path, "wb") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        server = cls(process, f"http://127.0.0.1:{port}", log_path)
        # A trainer that dies without closing its engine must not leave the server holding a GPU.
        weakref.finalize(server, _stop_group, process, STOP_GRACE_S)
        try:
            server.wait_healthy(startup_timeout_s)
        except BaseException:
            server.stop()
            raise
        return server

    def wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise EngineRequestError(
                    f"the launched server exited with code {self.process.returncode} during start-up; "
                    f"last lines of {self.log_path}:\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=HEALTH_POLL_S * 4) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass  # not listening yet, or still loading (503)
            time.sleep(HEALTH_POLL_S)
        raise EngineRequestError(
            f"the launched server did not answer /health within engine.startup_timeout_s={timeout_s}; "
            f"last lines of {self.log_path}:\n{self.log_tail()}"
        )

    def log_tail(self, num_lines: int = 20) -> str:
        lines = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(lines[-num_lines:])

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """Stop the server and every process it started."""
        _stop_group(self.process, grace_s)
