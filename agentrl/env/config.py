"""Environment stage settings: which env every episode is built from, or several envs in one run.

One env: `env.id` and `env.kwargs`, rows from the `data` section. Several (`env.mixture`): each
named entry brings its own env, rows (`data`, the same keys as the top-level section's sources)
and, where they differ, episode budgets (`rollout`); its `weight` is its share of every step's
prompts. A group (the n episodes of one row) always belongs to one env.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from agentrl.data import DataSource


class EnvBudgets(BaseModel):
    """Episode budgets of one env of a mixture; null keeps the `rollout` section's value."""

    model_config = ConfigDict(extra="forbid")

    max_turns: int | None = Field(None, gt=0, description="assistant turns per episode")
    max_new_tokens_per_turn: int | None = Field(
        None, gt=0, description="tokens the model may generate in one turn"
    )
    max_tokens_per_episode: int | None = Field(
        None, gt=0, description="prompt + response tokens of one episode"
    )


class MixtureEntry(BaseModel):
    """One env of a mixed run: how it is built, its rows, its share of each step and its budgets."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    id: str = Field(description="registered env id or 'module:Class'")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="passed to make(id, **kwargs)")
    weight: float = Field(
        1.0, ge=0, description="share of every step's prompts, relative to the other envs (0 leaves it out)"
    )
    data: DataSource = Field(description="this env's rows: train_files/val_files or a generator")
    rollout: EnvBudgets = Field(default_factory=EnvBudgets, description="this env's episode budgets")


class EnvConfig(BaseModel):
    """`make(id, **kwargs)` builds one env per episode; with `mixture`, each row's own env does."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field("math", description="registered env id or 'module:Class'")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="passed to make(id, **kwargs)")
    mixture: dict[str, MixtureEntry] = Field(
        default_factory=dict,
        description="several envs in one run, by name (used in metrics: reward/<name>/mean); "
        "replaces env.id, env.kwargs and the data section's sources",
    )

    @field_validator("mixture")
    @classmethod
    def _drop_unweighted_and_check_names(cls, mixture: dict[str, MixtureEntry]) -> dict[str, MixtureEntry]:
        """Entries of weight 0 are left out of the run: a preset's env switched off from the command line."""
        kept = {name: entry for name, entry in mixture.items() if entry.weight > 0}
        if mixture and not kept:
            raise ValueError(
                f"every env of env.mixture ({', '.join(mixture)}) has weight 0; give one a weight > 0"
            )
        for name in kept:
            if not name.replace("_", "").replace("-", "").isalnum():
                raise ValueError(
                    f"env.mixture name {name!r} must be letters, digits, '_' or '-' (it names metrics, "
                    "e.g. reward/<name>/mean)"
                )
        return kept
