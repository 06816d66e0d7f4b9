"""Configuration: the one pydantic schema every preset in configs/ and every CLI override obeys.

Section and knob names follow verl's where the concept is the same (`rollout.n`,
`data.train_batch_size`, `actor.clip_ratio_high`, `algorithm.adv_estimator`, ...). Each stage
owns its small config next to its code; this module composes them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agentrl.algorithms.config import AlgorithmConfig
from agentrl.trainer.actor_config import ActorConfig


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelConfig(Section):
    path: str = Field("tiny", description="HF checkpoint dir or hub id; 'tiny' = the bundled offline policy")
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="weights dtype")


class DataConfig(Section):
    train_files: list[str] = Field(default_factory=list, description="parquet/jsonl in verl's row layout")
    val_files: list[str] = Field(default_factory=list, description="held-out rows for evaluation")
    generator: str | None = Field(
        None, description="'module:function' that makes rows when no files are given"
    )
    generator_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="extra kwargs for the generator"
    )
    train_size: int = Field(2048, gt=0, description="rows to generate for training")
    val_size: int = Field(200, gt=0, description="rows to generate for evaluation")
    train_batch_size: int = Field(16, gt=0, description="prompts (groups) per training step")
    shuffle: bool = Field(True, description="reshuffle training rows every epoch")

    @model_validator(mode="after")
    def _has_a_source(self) -> DataConfig:
        if not self.train_files and self.generator is None:
            raise ValueError("set data.train_files=[...] or data.generator=module:function")
        return self


class EnvConfig(Section):
    id: str = Field("math", description="registered env id or 'module:Class'")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="passed to make(id, **kwargs)")


class ValKwargs(Section):
    temperature: float = Field(0.0, ge=0.0, description="0 = greedy")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    n: int = Field(1, gt=0, description="samples per held-out prompt")


class RolloutConfig(Section):
    n: int = Field(8, gt=0, description="trajectories per prompt (group size)")
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(-1, description="-1 disables top-k")
    max_turns: int = Field(1, gt=0, description="assistant turns per episode")
    max_new_tokens_per_turn: int = Field(64, gt=0, description="tokens the model may generate in one turn")
    max_tokens_per_episode: int = Field(512, gt=0, description="prompt + response tokens of one episode")
    step_timeout_s: float = Field(60.0, gt=0, description="limit on one env reset/step call")
    episode_timeout_s: float = Field(600.0, gt=0, description="limit on one whole episode")
    val_kwargs: ValKwargs = Field(default_factory=ValKwargs)


class EngineConfig(Section):
    backend: Literal["transformers"] = Field("transformers", description="inference engine")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto = cuda when available")
    max_batch_size: int = Field(64, gt=0, description="sequences decoded together in one forward pass")


class TrainerConfig(Section):
    project_name: str = "agentrl"
    experiment_name: str = Field("run", description="names the run dir runs/<experiment_name>")
    run_dir: str | None = Field(None, description="default: runs/<experiment_name>")
    total_training_steps: int = Field(20, ge=0)
    seed: int = 0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    save_freq: int = Field(10, ge=0, description="checkpoint every N steps (0: only at the end)")
    test_freq: int = Field(0, ge=0, description="evaluate every N steps (0: only at the end)")
    val_before_train: bool = True
    resume: Literal["auto", "disable"] = Field(
        "auto", description="auto: continue from the run dir's latest checkpoint"
    )
    max_checkpoints_to_keep: int = Field(2, gt=0)
    logger: list[Literal["console", "wandb"]] = Field(default_factory=lambda: ["console"])
    dump_rollouts: bool = Field(True, description="write each step's trajectories to rollouts/step_N.jsonl")
    num_threads: int = Field(0, ge=0, description="torch CPU threads (0: torch's default)")


class Config(Section):
    """The whole run. YAML presets and `key=value` overrides are validated against this."""

    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig
    env: EnvConfig = Field(default_factory=EnvConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    actor: ActorConfig = Field(default_factory=ActorConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)

    @model_validator(mode="after")
    def _batch_sizes_fit(self) -> Config:
        if self.data.train_batch_size % self.actor.ppo_mini_batch_size != 0:
            raise ValueError(
                f"data.train_batch_size={self.data.train_batch_size} must be a multiple of "
                f"actor.ppo_mini_batch_size={self.actor.ppo_mini_batch_size}"
            )
        return self
