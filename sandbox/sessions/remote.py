"""A session on a running `python -m sandbox.server`, with the same surface as a local one.

Stage: episode execution. Requests go through `SandboxClient.session_call`: creating, writing,
reading, resetting and closing are retried like any idempotent call; a command is retried only
while the server answers busy (it did not start), never after a failure that may have run it.
"""

from __future__ import annotations

import base64
import urllib.parse
from typing import TYPE_CHECKING

from sandbox.sessions.types import ExecResult, FileContent

if TYPE_CHECKING:
    from sandbox.client import SandboxClient


class RemoteSession:
    """A server-side session, addressed by its id."""

    def __init__(self, client: SandboxClient, session_id: str) -> None:
        self.session_id = session_id
        self._client = client
        self._path = f"/v1/sessions/{session_id}"
        self._closed = False

    async def exec(self, command: str, timeout_s: float | None = None) -> ExecResult:
        body = await self._client.session_call(
            "POST", f"{self._path}/exec", {"command": command, "timeout_s": timeout_s},
            retry=False, timeout_s=timeout_s or 0.0,
        )  # fmt: skip
        return ExecResult(**body)

    async def write_file(self, path: str, data: bytes) -> None:
        payload = {"path": path, "data_b64": base64.b64encode(data).decode()}
        await self._client.session_call("PUT", f"{self._path}/files", payload, retry=True)

    async def read_file(self, path: str) -> FileContent:
        query = urllib.parse.urlencode({"path": path})
        body = await self._client.session_call("GET", f"{self._path}/files?{query}", None, retry=True)
        return FileContent(base64.b64decode(body["data_b64"]), body["truncated"], body["exists"])

    async def reset(self) -> None:
        await self._client.session_call("POST", f"{self._path}/reset", {}, retry=True)

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self._client.session_call("DELETE", self._path, None, retry=True)
