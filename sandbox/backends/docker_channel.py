"""The host end of the Docker backend's control channel to the in-jail runner.

Requests go to the container's attached stdin as length-prefixed JSON (4-byte big-endian length);
answers come back the same way on its stdout, wrapped in Docker's attach framing (an 8-byte header
per frame: stream type, 3 zero bytes, big-endian payload size). Bytes travel base64-encoded.
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import struct
from dataclasses import dataclass, field
from typing import Any

from sandbox.backends.base import ProcessResult

_LENGTH = struct.Struct(">I")
_FRAME_HEADER = struct.Struct(">BxxxI")
_STDOUT = 1


class RunnerFailure(Exception):
    """The runner answered with an error, or its stream broke (the container died)."""


@dataclass
class RunOutput:
    """A run's stdout and stderr as the runner streams them (it caps them; we only collect)."""

    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)

    def add(self, stream: int, chunk: bytes) -> None:
        (self.stdout if stream == _STDOUT else self.stderr).extend(chunk)


class RunnerChannel:
    """One runner's request/answer stream; one request at a time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._stdout = bytearray()

    @classmethod
    async def open(cls, raw: socket.socket) -> RunnerChannel:
        raw.setblocking(False)
        reader, writer = await asyncio.open_connection(sock=raw, limit=1 << 20)
        return cls(reader, writer)

    async def request(
        self, op: str, fields: dict[str, Any], timeout_s: float | None, output: RunOutput | None = None
    ) -> dict[str, Any]:
        """Send one request and wait (up to `timeout_s`, None = forever) for its answer.

        A run streams its output before its answer; it is collected into `output`.
        """
        payload = json.dumps({"op": op, **_encode(fields)}).encode()
        try:
            self._writer.write(_LENGTH.pack(len(payload)) + payload)
            await self._writer.drain()
            answer = await asyncio.wait_for(self._read_answer(output), timeout_s)
        except (ConnectionError, asyncio.IncompleteReadError) as error:
            raise RunnerFailure(f"the runner's stream closed ({type(error).__name__})") from error
        if not answer.get("ok"):
            raise RunnerFailure(answer.get("error", "no error message"))
        return answer

    async def _read_answer(self, output: RunOutput | None) -> dict[str, Any]:
        while "output" in (message := await self._read_message()):
            if output is None:
                raise RunnerFailure(f"the runner sent output outside a run: {str(message)[:200]}")
            output.add(message["output"], base64.b64decode(message["data"]))
        return message

    async def _read_message(self) -> dict[str, Any]:
        (length,) = _LENGTH.unpack(await self._read_stdout(_LENGTH.size))
        return json.loads(await self._read_stdout(length))

    async def _read_stdout(self, num_bytes: int) -> bytes:
        while len(self._stdout) < num_bytes:
            stream_type, size = _FRAME_HEADER.unpack(await self._reader.readexactly(_FRAME_HEADER.size))
            frame = await self._reader.readexactly(size)
            if stream_type == _STDOUT:
                self._stdout += frame
        data = bytes(self._stdout[:num_bytes])
        del self._stdout[:num_bytes]
        return data

    async def close(self) -> None:
        self._writer.close()
        try:
            await self._writer.wait_closed()
        except (ConnectionError, OSError):
            pass  # the container is already gone


def _encode(value: Any) -> Any:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, dict):
        return {key: _encode(item) for key, item in value.items()}
    return value


def process_result(answer: dict[str, Any], output: RunOutput) -> ProcessResult:
    """The runner's JSON result and the output it streamed as a ProcessResult."""
    return ProcessResult(
        exit_code=answer["exit_code"],
        signal=answer["signal"],
        stdout=bytes(output.stdout),
        stderr=bytes(output.stderr),
        wall_time_s=answer["wall_time_s"],
        cpu_time_s=answer["cpu_time_s"],
        timed_out=answer["timed_out"],
        memory_exceeded=answer["memory_exceeded"],
        output_exceeded=answer["output_exceeded"],
        suspicious=answer["suspicious"],
    )
