"""Gateway stage: sessions, each one episode's calls behind its own unguessable base URL.

A session id is 32 random bytes (`secrets`), so its URL is its capability; it expires
`ttl_s` after it opens and is closed by whoever opened it once the episode is over, after which
its URL answers 404 and nothing more is recorded. Calls of one session are served one at a
time, in arrival order, so "the previous call" is always well defined.
"""

from __future__ import annotations

import asyncio
import math
import secrets
import time
from dataclasses import dataclass

from agentrl.engine.protocol import SamplingParams
from agentrl.gateway.conversation import CallRequest
from agentrl.gateway.segments import PreparedCall, SessionEnded, SessionTrajectory
from agentrl.gateway.turn_format import TurnFormat
from agentrl.rollout.config import Budgets, Sampling
from agentrl.rollout.trajectory import Status


@dataclass(frozen=True)
class Ending:
    """Why a session stopped serving calls."""

    status: Status
    message: str


class Session:
    """One episode's calls: its trajectory so far, its reward and how it ended."""

    def __init__(
        self,
        session_id: str,
        turn_format: TurnFormat,
        budgets: Budgets,
        *,
        group_id: int = 0,
        sampling_seed: int = 0,
        sampling: Sampling | None = None,
        ttl_s: float,
    ) -> None:
        self.id = session_id
        self.format = turn_format
        self.record = SessionTrajectory(turn_format, budgets, group_id)
        self.sampling_seed = sampling_seed
        # Training sessions sample as the rollout does (the loss scores these logprobs at its
        # temperature), whatever the client asks; a standalone session samples as asked.
        self.sampling = sampling
        self.expires_at = time.monotonic() + ttl_s
        self.lock = asyncio.Lock()
        self.reward: float | None = None  # posted to /s/{id}/reward
        self.ending: Ending | None = None

    @property
    def trajectory(self):
        return self.record.trajectory

    def end(self, status: Status, message: str) -> None:
        if self.ending is None:
            self.ending = Ending(status, message)

    def prepare(self, request: CallRequest) -> PreparedCall:
        """The call's context; SessionEnded (and the session ends) when it cannot be served."""
        if self.ending is not None:
            raise SessionEnded(self.ending.status, f"the session has ended: {self.ending.message}")
        try:
            return self.record.prepare(request)
        except SessionEnded as ended:
            self.end(ended.status, str(ended))
            raise

    def sampling_params(self, request: CallRequest, prepared: PreparedCall) -> SamplingParams:
        """The rollout's seeds and budgets; the client's sampling only outside training."""
        room = self.record.room(prepared)
        max_new_tokens = min(room, request.max_tokens) if request.max_tokens is not None else room
        if self.sampling is not None:
            temperature, top_p, top_k = self.sampling.temperature, self.sampling.top_p, self.sampling.top_k
        else:
            temperature = 1.0 if request.temperature is None else request.temperature
            top_p, top_k = (1.0 if request.top_p is None else request.top_p), -1
        return SamplingParams(
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            seed=self.sampling_seed + len(self.record.calls),  # as the rollout seeds each turn
            stop_token_ids=self.format.stop_token_ids,
        )

    def after_reply(self, finish_reason: str, prepared: PreparedCall, num_sampled: int) -> None:
        """A turn cut by the episode budget leaves no room for another: the episode is truncated."""
        budget = self.record.budgets.max_tokens_per_episode
        if finish_reason == "length" and len(prepared.context_ids) + num_sampled >= budget:
            self.end(Status.TRUNCATED_TOKENS, f"max_tokens_per_episode={budget}")


class SessionStore:
    """Open sessions by id; expired ones are dropped whenever the store is used."""

    def __init__(self, max_sessions: int) -> None:
        self.max_sessions = max_sessions
        self._sessions: dict[str, Session] = {}

    def open(
        self, turn_format: TurnFormat, budgets: Budgets, *, ttl_s: float = math.inf, **kwargs
    ) -> Session:
        self._drop_expired()
        if len(self._sessions) >= self.max_sessions:
            raise RuntimeError(f"{self.max_sessions} sessions are open (max_sessions); close finished ones")
        session = Session(secrets.token_urlsafe(32), turn_format, budgets, ttl_s=ttl_s, **kwargs)
        self._sessions[session.id] = session
        return session

    def get(self, session_id: str) -> Session | None:
        self._drop_expired()
        return self._sessions.get(session_id)

    def close(self, session_id: str) -> Session | None:
        return self._sessions.pop(session_id, None)

    def __len__(self) -> int:
        return len(self._sessions)

    def _drop_expired(self) -> None:
        now = time.monotonic()
        for session_id in [s.id for s in self._sessions.values() if s.expires_at <= now]:
            del self._sessions[session_id]
