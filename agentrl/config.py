"""Configuration: the one pydantic schema every preset in configs/ and every CLI override obeys.

Section and knob names follow verl's where the concept is the same (`rollout.n`,
`data.train_batch_size`, `actor.clip_ratio_high`, `algorithm.adv_estimator`, ...). Each section
lives next to the code it configures and is what that code takes; this module only composes
them and checks what spans sections. The schema's defaults are the shipped defaults. Every
section refuses NaN and infinite numbers (`allow_inf_nan=False`): no setting means anything with
them. Nothing imported here loads torch or transformers, so a bad key fails in well under a second.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agentrl.algorithms.config import AlgorithmConfig
from agentrl.data import DataConfig, DataSource
from agentrl.engine.config import EngineConfig, ModelConfig
from agentrl.env.config import EnvConfig
from agentrl.launchers.config import RayConfig
from agentrl.rewards.config import RewardConfig
from agentrl.rollout.config import RolloutConfig
from agentrl.trainer.actor_config import ActorConfig
from agentrl.trainer.config import TrainerConfig

__all__ = ["Config"]

_ENV_DEFAULTS = {
    name: field.get_default(call_default_factory=True) for name, field in EnvConfig.model_fields.items()
}
_DATA_DEFAULTS = {
    name: field.get_default(call_default_factory=True) for name, field in DataSource.model_fields.items()
}


class Config(BaseModel):
    """The whole run. YAML presets and `key=value` overrides are validated against this."""

    model_config = ConfigDict(extra="forbid")

    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig
    env: EnvConfig = Field(default_factory=EnvConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    actor: ActorConfig = Field(default_factory=ActorConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    ray: RayConfig = Field(default_factory=RayConfig)

    @model_validator(mode="after")
    def _batch_sizes_fit(self) -> Config:
        if self.data.train_batch_size % self.actor.ppo_mini_batch_size != 0:
            raise ValueError(
                f"data.train_batch_size={self.data.train_batch_size} must be a multiple of "
                f"actor.ppo_mini_batch_size={self.actor.ppo_mini_batch_size}"
            )
        return self

    @model_validator(mode="after")
    def _rows_have_one_source(self) -> Config:
        if not self.env.mixture:
            self.data.check_has_a_source()
            return self
        # Compared with the defaults, not "was it set": a dumped config.yaml holds every key.
        ignored = [f"env.{key}" for key in ("id", "kwargs") if getattr(self.env, key) != _ENV_DEFAULTS[key]]
        ignored += [
            f"data.{key}" for key in DataSource.model_fields if getattr(self.data, key) != _DATA_DEFAULTS[key]
        ]
        if ignored:
            raise ValueError(
                f"{ignored[0]} is set but env.mixture names the envs, and each brings its own rows; set it "
                f"per env (env.mixture.<name>.{ignored[0].removeprefix('env.')})"
            )
        for name, entry in self.env.mixture.items():
            entry.data.check_has_a_source(f"env.mixture.{name}.data")
        return self

    @model_validator(mode="after")
    def _groups_have_a_baseline(self) -> Config:
        if self.rollout.n < 2:
            raise ValueError(
                f"rollout.n={self.rollout.n} with algorithm.adv_estimator={self.algorithm.adv_estimator}: "
                "a group-relative advantage compares each trajectory with the others of its prompt, so "
                "a group of one always gets advantage 0 and nothing trains; set rollout.n >= 2"
            )
        return self

    @model_validator(mode="after")
    def _overlong_buffer_fits(self) -> Config:
        buffer = self.reward.overlong_buffer
        rollout = self.rollout
        buffer.check(buffer.resolved_max_resp_len(rollout.max_turns, rollout.max_new_tokens_per_turn))
        return self

    @model_validator(mode="after")
    def _async_needs_a_plain_batch(self) -> Config:
        if self.rollout.mode == "async" and self.algorithm.filter_groups.enable:
            raise ValueError(
                "rollout.mode=async with algorithm.filter_groups.enable=true: dynamic sampling decides how many "
                "rounds a step needs only after seeing its rewards, so it cannot be generated ahead; use one"
            )
        return self

    @model_validator(mode="after")
    def _distributed_sync_needs_servers(self) -> Config:
        split = self.trainer.launcher == "ray" and self.ray.placement == "split"
        if self.engine.weight_sync == "distributed" and self.engine.backend != "sglang" and not split:
            raise ValueError(
                "engine.weight_sync=distributed broadcasts the weights to engine servers, but this run's engine "
                "is in process (it takes the trainer's tensors directly); use engine=sglang, or "
                "trainer.launcher=ray with ray.placement=split, or leave engine.weight_sync=disk"
            )
        return self

    @model_validator(mode="after")
    def _ray_settings_need_the_ray_launcher(self) -> Config:
        if self.trainer.launcher != "ray":
            changed = [
                name
                for name in RayConfig.model_fields
                if getattr(self.ray, name) != getattr(RayConfig(), name)
            ]
            if changed:
                raise ValueError(
                    f"ray.{changed[0]} is set but trainer.launcher={self.trainer.launcher}: Ray settings only "
                    "apply with trainer.launcher=ray"
                )
        return self

    def warnings(self) -> list[str]:
        """Settings that are valid but probably not what the user wants."""
        warnings = [self.rollout.truncation_warning(), self.engine.seed_warning()]
        return [warning for warning in warnings if warning]
