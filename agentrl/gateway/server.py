"""Gateway stage: the HTTP server agents call instead of a model provider.

    POST /s/{session}/v1/chat/completions   OpenAI Chat Completions (stream or not)
    POST /s/{session}/v1/messages           Anthropic Messages (stream or not)
    POST /s/{session}/v1/responses          OpenAI Responses (the agent-loop subset)
    GET  /s/{session}/v1/models             the one model served
    POST /s/{session}/reward                {"reward": <number>}: the episode's reward
    GET  /s/{session}/record                every call's prompt ids, sampled ids, logprobs, version
    POST /sessions                          open a session (standalone server only)

Each call: the dialect validates the request and converts it to template messages; the session
decides the prompt (extend or new sample) and refuses calls past a budget; the engine samples
token ids under the gateway's concurrency bound; the session records the tokens and parses the
turn; the dialect answers. Every route needs the API key (`Authorization: Bearer <key>` or
`x-api-key: <key>`); the server binds to loopback unless a host is named together with a key.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import json
import math
import secrets
from types import ModuleType
from typing import Any, Self

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from agentrl.engine.protocol import InferenceEngine
from agentrl.gateway import anthropic_messages, openai_chat, openai_responses
from agentrl.gateway.conversation import RequestError
from agentrl.gateway.segments import SessionEnded
from agentrl.gateway.sessions import Session, SessionStore
from agentrl.gateway.turn_format import TurnFormat
from agentrl.gateway.wire import validate
from agentrl.rollout.config import Budgets
from agentrl.rollout.trajectory import Status

DIALECTS: dict[str, ModuleType] = {
    "chat/completions": openai_chat,
    "messages": anthropic_messages,
    "responses": openai_responses,
}
MAX_REQUEST_BYTES = 16 * 2**20


class _RewardBody(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    reward: float


class _SessionBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ttl_s: float = Field(3600.0, gt=0)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Gateway:
    """Per-session base URLs in front of one engine and one chat format."""

    def __init__(
        self,
        engine: InferenceEngine,
        turn_format: TurnFormat,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        api_key: str | None = None,
        max_concurrent_calls: int = 64,
        max_sessions: int = 4096,
        model_name: str = "agentrl-policy",
        session_budgets: Budgets | None = None,
    ) -> None:
        if not is_loopback(host) and not api_key:
            raise ValueError(
                f"the gateway binds to {host!r}, beyond this machine: give it an API key (--api-key) "
                "or bind to 127.0.0.1"
            )
        if max_concurrent_calls < 1:
            raise ValueError(f"max_concurrent_calls must be >= 1, got {max_concurrent_calls}")
        self.engine, self.format = engine, turn_format
        self.host, self.port = host, port
        self.api_key = api_key or secrets.token_urlsafe(32)
        self.model_name = model_name
        self.sessions = SessionStore(max_sessions)
        self.session_budgets = session_budgets  # POST /sessions is served only with these
        self._calls = asyncio.Semaphore(max_concurrent_calls)
        self._runner: web.AppRunner | None = None

    # -- life cycle --

    async def start(self) -> Gateway:
        app = web.Application(client_max_size=MAX_REQUEST_BYTES)
        app.add_routes([
            web.post("/s/{session}/v1/{dialect:chat/completions|messages|responses}", self._model_call),
            web.get("/s/{session}/v1/models", self._models),
            web.post("/s/{session}/reward", self._reward),
            web.get("/s/{session}/record", self._record),
            web.post("/sessions", self._open_session),
        ])  # fmt: skip
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # the one bound when port was 0
        return self

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    # -- sessions --

    def open_session(self, budgets: Budgets, *, ttl_s: float = math.inf, **kwargs: Any) -> Session:
        """A new session (kwargs: group_id, sampling_seed, sampling); its URL is `base_url(session)`."""
        return self.sessions.open(self.format, budgets, ttl_s=ttl_s, **kwargs)

    def base_url(self, session: Session) -> str:
        """The session's root: OpenAI clients take `<root>/v1`, Anthropic clients the root itself."""
        return f"{self.url}/s/{session.id}"

    def close_session(self, session_id: str) -> Session | None:
        return self.sessions.close(session_id)

    # -- routes --

    async def _model_call(self, http: web.Request) -> web.StreamResponse:
        dialect = DIALECTS[http.match_info["dialect"]]
        session, refusal = self._admit(http, dialect)
        if refusal is not None:
            return refusal
        try:
            body = await http.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error(dialect, 400, "the request body is not valid JSON", None)
        try:
            request = dialect.parse(body)
        except RequestError as error:
            return _error(dialect, error.status, str(error), error.param)
        async with session.lock:
            try:
                prepared = session.prepare(request)
            except SessionEnded as ended:
                return _error(dialect, 400, str(ended), "messages")
            params = session.sampling_params(request, prepared)
            try:
                async with self._calls:
                    generation = await self.engine.generate(prepared.context_ids, params)
            except Exception as exc:  # noqa: BLE001  # any engine failure ends this session's episode
                session.end(Status.ENGINE_ERROR, f"engine: {type(exc).__name__}: {exc}")
                return _error(dialect, 500, f"the engine failed: {type(exc).__name__}", None)
            sampled = self.format.cut(generation)
            reply = session.record.commit(request, prepared, sampled)
            session.after_reply(sampled.finish_reason, prepared, len(sampled.completion_ids))
        if not request.stream:
            return web.json_response(dialect.response(reply, request))
        stream = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await stream.prepare(http)
        for event in dialect.stream(reply, request, body):
            await stream.write(event)
        await stream.write_eof()
        return stream

    async def _models(self, http: web.Request) -> web.Response:
        _, refusal = self._admit(http, openai_chat)
        if refusal is not None:
            return refusal
        model = {"id": self.model_name, "object": "model", "created": 0, "owned_by": "agentrl"}
        return web.json_response({"object": "list", "data": [model]})

    async def _reward(self, http: web.Request) -> web.Response:
        session, refusal = self._admit(http, openai_chat)
        if refusal is not None:
            return refusal
        try:
            body = validate(_RewardBody, await http.json())
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error(openai_chat, 400, "the request body is not valid JSON", None)
        except RequestError as error:
            return _error(openai_chat, 400, str(error), error.param)
        session.reward = body.reward
        return web.json_response({"reward": body.reward})

    async def _record(self, http: web.Request) -> web.Response:
        session, refusal = self._admit(http, openai_chat)
        if refusal is not None:
            return refusal
        ending = session.ending
        return web.json_response({
            "calls": [dataclasses.asdict(call) for call in session.record.calls],
            "num_samples": len(session.trajectory.earlier_segments) + bool(session.record.calls),
            "reward": session.reward,
            "ending": None if ending is None else {"status": ending.status.value, "message": ending.message},
        })  # fmt: skip

    async def _open_session(self, http: web.Request) -> web.Response:
        if not self._authorized(http):
            return _error(openai_chat, 401, "missing or wrong API key", None)
        if self.session_budgets is None:
            return _error(openai_chat, 404, "sessions are opened by the trainer on this gateway", None)
        try:
            body = validate(_SessionBody, await http.json() if http.can_read_body else {})
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error(openai_chat, 400, "the request body is not valid JSON", None)
        except RequestError as error:
            return _error(openai_chat, 400, str(error), error.param)
        session = self.open_session(
            self.session_budgets, ttl_s=body.ttl_s, sampling_seed=secrets.randbits(31)
        )
        return web.json_response({"session_id": session.id, "base_url": self.base_url(session)})

    def _admit(
        self, http: web.Request, dialect: ModuleType
    ) -> tuple[Session, None] | tuple[None, web.Response]:
        """The request's session if the key is right and the session open; else the dialect's error."""
        if not self._authorized(http):
            return None, _error(dialect, 401, "missing or wrong API key", None)
        session = self.sessions.get(http.match_info["session"])
        if session is None:
            return None, _error(dialect, 404, "no such session (it expired, ended or never existed)", None)
        return session, None

    def _authorized(self, http: web.Request) -> bool:
        given = http.headers.get("x-api-key") or http.headers.get("Authorization", "").removeprefix("Bearer ")
        return secrets.compare_digest(given.encode(), self.api_key.encode())


def _error(dialect: ModuleType, status: int, message: str, param: str | None) -> web.Response:
    return web.json_response(dialect.error(status, message, param), status=status)
