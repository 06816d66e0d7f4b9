"""Gateway: agents written against the OpenAI or Anthropic client train unmodified.

A per-session base URL renders each call with the run's chat template, generates token ids in
and out through the configured engine, answers in the caller's dialect and records every call's
tokens, logprobs and policy version; a session becomes a trajectory by the extend-or-segment
rule (`segments`). `AgentEnv` (env=agent) runs an agent program per episode against it.
"""

from agentrl.gateway.server import Gateway
from agentrl.gateway.sessions import Session, SessionStore
from agentrl.gateway.turn_format import TurnFormat

__all__ = ["Gateway", "Session", "SessionStore", "TurnFormat"]
