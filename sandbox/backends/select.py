"""Backend selection by name: auto (Docker when an engine answers, else bubblewrap), docker, bwrap, unsafe-local."""

from __future__ import annotations

from enum import Enum
from typing import Any

from sandbox.backends.base import Backend


class BackendName(str, Enum):
    AUTO = "auto"
    DOCKER = "docker"
    BWRAP = "bwrap"
    UNSAFE_LOCAL = "unsafe-local"


BACKEND_NAMES = [name.value for name in BackendName]


def docker_engine_answers() -> bool:
    """Whether a Docker engine responds to ping (the docker SDK reads DOCKER_HOST or the default socket)."""
    try:
        import docker

        client = docker.from_env(timeout=3)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:  # noqa: BLE001 - no engine, no socket, no permission: all mean "not available"
        return False


async def create_backend(name: str = "auto", **backend_kwargs: Any) -> Backend:
    """Build the backend called `name`; kwargs go to that backend's `create`."""
    try:
        choice = BackendName(name)
    except ValueError:
        raise ValueError(f"unknown sandbox backend {name!r}; choose one of {BACKEND_NAMES}") from None
    if choice == BackendName.AUTO:
        choice = BackendName.DOCKER if docker_engine_answers() else BackendName.BWRAP
    if choice == BackendName.DOCKER:
        from sandbox.backends.docker import DockerBackend  # written alongside; imported only when used

        return await DockerBackend.create(**backend_kwargs)
    if choice == BackendName.BWRAP:
        from sandbox.backends.bwrap import BwrapBackend

        return await BwrapBackend.create(**backend_kwargs)
    from sandbox.backends.local import LocalBackend

    if backend_kwargs:
        raise ValueError(f"the unsafe-local backend takes no options, got {sorted(backend_kwargs)}")
    return await LocalBackend.create()
