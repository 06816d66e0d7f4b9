"""Training-loop settings: run directory, step counts, evaluation, checkpoints, logging, error limits."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from agentrl.run_files import PathSetting, file_name_problem

WANDB_NAME_CHARACTERS = "/\\#?%:"  # characters Weights & Biases refuses in a project name


class TrainerConfig(BaseModel):
    """What the training loop runs, where it writes, and when it gives up on a failing env."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    project_name: str = Field("agentrl", description="Weights & Biases project")
    experiment_name: str = Field("run", description="names the run dir runs/<experiment_name>")
    run_dir: PathSetting | None = Field(None, description="default: runs/<experiment_name>")
    total_training_steps: int = Field(
        20, ge=0, description="optimizer steps of the whole run (0: evaluate only)"
    )
    seed: int = Field(0, ge=0, lt=2**32, description="seeds data order, sampling and the env's tasks")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="policy workers' device")
    launcher: Literal["local", "ray"] = Field(
        "local",
        description="local: this process (or torchrun's ranks); ray: Ray actors placed by the ray section",
    )
    save_freq: int = Field(10, ge=0, description="checkpoint every N steps (0: only at the end)")
    test_freq: int = Field(0, ge=0, description="evaluate every N steps (0: only at the end)")
    val_before_train: bool = Field(True, description="evaluate before the first step")
    resume: Literal["auto", "disable"] = Field(
        "auto", description="auto: continue from the run dir's latest checkpoint"
    )
    max_checkpoints_to_keep: int = Field(2, gt=0, description="older checkpoints are deleted")
    logger: list[Literal["console", "wandb"]] = Field(
        default_factory=lambda: ["console", "wandb"],
        description="where metrics go besides metrics.jsonl (wandb runs offline without WANDB_API_KEY)",
    )
    dump_rollouts: bool = Field(True, description="write each step's trajectories to rollouts/step_N.jsonl")
    num_threads: int = Field(0, ge=0, le=1024, description="torch CPU threads (0: torch's default)")
    max_error_frac: float = Field(
        0.5, ge=0, le=1, description="warn when more than this fraction of a step's episodes failed"
    )
    max_error_steps: int = Field(
        3, ge=1, description="stop the run after this many consecutive steps above max_error_frac"
    )

    @field_validator("project_name")
    @classmethod
    def _a_wandb_project_name(cls, value: str) -> str:
        if not value or len(value) > 128 or any(char in value for char in WANDB_NAME_CHARACTERS):
            raise ValueError(
                f"a Weights & Biases project name has 1 to 128 characters, none of {WANDB_NAME_CHARACTERS}"
            )
        return value

    @field_validator("experiment_name")
    @classmethod
    def _a_file_name(cls, value: str) -> str:
        if problem := file_name_problem(value):
            raise ValueError(f"it names the run dir runs/<experiment_name>, but {problem}")
        return value
