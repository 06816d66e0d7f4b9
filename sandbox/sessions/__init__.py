"""Stateful sandbox sessions: one jail per episode whose files persist across commands."""

from sandbox.sessions.jail import JailBackedSession
from sandbox.sessions.pool import SessionPool, SessionPoolSettings
from sandbox.sessions.shared import close_session_pools, shared_session_pool
from sandbox.sessions.types import ExecResult, FileContent, Session, SessionFailure, SessionLimits

__all__ = [
    "ExecResult",
    "FileContent",
    "JailBackedSession",
    "Session",
    "SessionFailure",
    "SessionLimits",
    "SessionPool",
    "SessionPoolSettings",
    "close_session_pools",
    "shared_session_pool",
]
