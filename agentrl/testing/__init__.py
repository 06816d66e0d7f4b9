"""agentrl.testing: a kit for testing environments.

- scripted policies: `play` / `play_sync` step an env with fixed assistant replies;
  `ScriptedEngine` replays them as tokens through the real agent loop;
- `check_env_contract(env, rows)`: Gymnasium's checker, the boundary validation, determinism
  under a seed and task handling through `reset(options=row)`;
- reward-hacking probes: `answer_probes`, `tool_call_probes`, `code_probes`, played by
  `find_reward_hacks(env, row, probes)`.
"""

from agentrl.testing.contract import DEFAULT_ACTIONS, EnvContractError, check_env_contract
from agentrl.testing.probes import (
    Probe,
    ProbeResult,
    answer_probes,
    code_probes,
    find_reward_hacks,
    tool_call_probes,
)
from agentrl.testing.scripted import (
    SCRIPTED_LOGPROB,
    ScriptedEngine,
    ScriptedEpisode,
    ScriptedStep,
    play,
    play_sync,
)

__all__ = [
    "DEFAULT_ACTIONS",
    "SCRIPTED_LOGPROB",
    "EnvContractError",
    "Probe",
    "ProbeResult",
    "ScriptedEngine",
    "ScriptedEpisode",
    "ScriptedStep",
    "answer_probes",
    "check_env_contract",
    "code_probes",
    "find_reward_hacks",
    "play",
    "play_sync",
    "tool_call_probes",
]
