"""Environment stage: the TextEnv base class, its spaces and the id registry."""

from agentrl.env.base import Message, StepResult, TextEnv
from agentrl.env.errors import EnvAborted, InfraError
from agentrl.env.registry import Registration, load_object, make, register, registered_ids
from agentrl.env.spaces import ChatMessages, Text

__all__ = [
    "ChatMessages",
    "EnvAborted",
    "InfraError",
    "Message",
    "Registration",
    "StepResult",
    "Text",
    "TextEnv",
    "load_object",
    "make",
    "register",
    "registered_ids",
]
