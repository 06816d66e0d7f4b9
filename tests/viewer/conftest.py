"""Fixtures for the viewer: a hand-written run dir, the viewer as a subprocess, headless Chromium."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from tests.viewer.run_dirs import write_run

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return write_run(tmp_path / "runs" / "math_run")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_viewer(*run_dirs: Path) -> tuple[subprocess.Popen, str]:
    """`python -m agentrl.viewer` exactly as a user starts it; returns once it answers."""
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "agentrl.viewer", *map(str, run_dirs), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the viewer exited with {process.returncode}: {process.stdout.read()}")
        try:
            urllib.request.urlopen(f"{url}/api/version", timeout=1).read()
            return process, url
        except OSError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError("the viewer did not answer within 30 s")


@pytest.fixture
def viewer(run_dir: Path):
    """Base URL of a viewer serving the folder that holds `run_dir`."""
    process, url = start_viewer(run_dir.parent)
    yield url
    process.terminate()
    process.wait(timeout=10)


@pytest.fixture(scope="session")
def browser():
    """Headless Chromium from the OS packages. Missing browser: the test fails, never skips."""
    missing = [str(path) for path in (CHROMIUM, CHROMEDRIVER) if not path.exists()]
    if missing:
        pytest.fail(
            f"{', '.join(missing)} not found: install with `apt-get install -y chromium chromium-driver`"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1280,900"):  # fmt: skip
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    yield driver
    driver.quit()


@pytest.fixture(scope="session")
def screenshots(tmp_path_factory) -> Path:
    """Where browser tests keep their screenshots: $AGENTRL_TEST_ARTIFACTS, else pytest's tmp dir."""
    root = os.environ.get("AGENTRL_TEST_ARTIFACTS")
    folder = Path(root) / "viewer" if root else tmp_path_factory.mktemp("viewer-screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder
