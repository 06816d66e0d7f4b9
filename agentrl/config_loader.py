"""Configuration stage: presets from configs/ + `group=name` + `key.sub=value` -> a validated Config.

Resolution order: configs/defaults.yaml, then one preset per config group (the defaults' choice
unless the command line names another, e.g. `env=code_sandbox`), then `key=value` overrides.
Every key is checked against the schema before anything is loaded, so a typo fails fast with
the closest valid key.
"""

from __future__ import annotations

import difflib
import json
import sys
from importlib import resources
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from pydantic import BaseModel, ValidationError

from agentrl.config import Config

DEFAULTS_FILE = "defaults.yaml"


class ConfigError(ValueError):
    """A preset or override that does not fit the schema; the message says how to fix it."""


def configs_root() -> resources.abc.Traversable:
    """The presets shipped with the package (works from a checkout and from an install)."""
    return resources.files("configs")


def config_groups() -> dict[str, list[str]]:
    """Group name -> available preset names, e.g. {"env": ["math", ...]}."""
    root = configs_root()
    return {
        entry.name: sorted(p.name.removesuffix(".yaml") for p in entry.iterdir() if p.name.endswith(".yaml"))
        for entry in root.iterdir()
        if entry.is_dir() and not entry.name.startswith("_")
    }


def _read_yaml(path: resources.abc.Traversable) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a preset must be a mapping of keys, got {type(data).__name__}")
    return data


def _check_keys(data: dict[str, Any], model: type[BaseModel], prefix: str = "") -> None:
    """Raise ConfigError naming the first unknown key (and the closest valid one) or misplaced value."""
    for key, value in data.items():
        fields = model.model_fields
        if key not in fields:
            valid = [f"{prefix}{name}" for name in fields]
            close = difflib.get_close_matches(f"{prefix}{key}", valid, n=1, cutoff=0.5)
            hint = f"; did you mean '{close[0]}'?" if close else f"; valid keys here: {', '.join(valid)}"
            raise ConfigError(f"unknown config key '{prefix}{_shorten(str(key))}'{hint}")
        annotation = fields[key].annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            if not isinstance(value, dict):
                first = next(iter(annotation.model_fields))
                raise ConfigError(
                    f"'{prefix}{key}' is a section of settings, not a value (got {_shorten(repr(value))}); "
                    f"set its keys, e.g. {prefix}{key}.{first}=..."
                )
            _check_keys(value, annotation, f"{prefix}{key}.")


def _split_args(args: list[str], groups: dict[str, list[str]]) -> tuple[dict[str, str], list[str]]:
    """Separate preset selections (`env=math`) from key overrides (`env.id=math`)."""
    selections, overrides = {}, []
    for arg in args:
        if "=" not in arg:
            raise ConfigError(f"expected key=value, got '{arg}' (e.g. env=math or actor.optim.lr=1e-6)")
        key, value = arg.split("=", 1)
        if key not in groups:
            overrides.append(arg)
        elif value in groups[key]:
            selections[key] = value
        else:
            raise ConfigError(
                f"no preset '{value}' in config group '{key}'; available: {', '.join(groups[key])}"
            )
    return selections, overrides


def _shorten(text: str, limit: int = 80) -> str:
    """`text` cut to about `limit` characters, so that an error stays one readable line."""
    return text if len(text) <= limit else f"{text[: limit - 3]}... ({len(text)} characters)"


def _format_validation_error(error: ValidationError) -> str:
    problems = []
    for item in error.errors():
        location = ".".join(str(part) for part in item["loc"]) or "config"
        value = (
            f" (got {_shorten(repr(item['input']))})"
            if "input" in item and not isinstance(item["input"], dict)
            else ""
        )
        problems.append(f"{location}: {item['msg'].removeprefix('Value error, ')}{value}")
    return "invalid config: " + "; ".join(problems)


def _one_line(error: Exception) -> str:
    """The gist of a parser's or omegaconf's multi-line message."""
    if isinstance(error, yaml.MarkedYAMLError):
        return " ".join(part for part in (error.context, error.problem) if part)
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _merge_override(merged: DictConfig, override: str) -> DictConfig:
    """`merged` with one `key=value` applied; ConfigError names the override that does not fit."""
    try:
        conf = OmegaConf.from_dotlist([override])
    except (OmegaConfBaseException, yaml.YAMLError, ValueError) as exc:  # grammar errors
        raise ConfigError(f"cannot parse override {_shorten(repr(override))}: {_one_line(exc)}") from None
    _check_keys(OmegaConf.to_container(conf), Config)
    try:
        return OmegaConf.merge(merged, conf)
    except (OmegaConfBaseException, TypeError, ValueError) as exc:  # e.g. a list where presets hold a mapping
        key = override.split("=", 1)[0]
        raise ConfigError(
            f"cannot set {key} from {_shorten(repr(override))}: {_one_line(exc)}; "
            f"the value's type must match the setting's (see --describe {key})"
        ) from None


def _resolve(merged: DictConfig) -> dict[str, Any]:
    """The merged config as plain data, every `${...}` interpolation resolved."""
    try:
        return OmegaConf.to_container(merged, resolve=True)
    except OmegaConfBaseException as exc:
        where = f"{exc.full_key}: " if getattr(exc, "full_key", None) else ""
        raise ConfigError(
            f"{where}cannot resolve the interpolation ({_one_line(exc)}); ${{key.sub}} stands for the "
            "value of another setting, e.g. ${trainer.experiment_name}"
        ) from None


def _files_replace_a_presets_generator(merged: DictConfig, overrides: list[str]) -> tuple[DictConfig, str]:
    """`data.train_files=[...]` typed over a preset that generates its rows replaces the generator.

    As in verl, data files on the command line are the run's data; a preset that itself sets both
    stays an error (the schema's). Returns the presets without the generator and a note saying so.
    """
    keys = {override.split("=", 1)[0] for override in overrides}
    generator = OmegaConf.select(merged, "data.generator")
    if "data.train_files" not in keys or "data.generator" in keys or generator is None:
        return merged, ""
    merged = merged.copy()
    OmegaConf.update(merged, "data.generator", None)
    OmegaConf.update(merged, "data.generator_kwargs", {}, merge=False)
    return merged, f"note: data.train_files replaces the preset's data.generator={generator}"


def load_config(args: list[str]) -> Config:
    """Build the validated Config for command-line `args` (group selections and overrides)."""
    root = configs_root()
    groups = config_groups()
    merged = OmegaConf.create(_read_yaml(root / DEFAULTS_FILE))
    chosen = dict(merged.pop("defaults", {}) or {})
    selections, overrides = _split_args(args, groups)
    chosen.update(selections)
    for group, name in chosen.items():
        if group not in groups or name not in groups[group]:
            raise ConfigError(f"defaults.yaml selects unknown preset {group}={name}")
        preset = _read_yaml(root / group / f"{name}.yaml")
        merged = OmegaConf.merge(merged, OmegaConf.create(preset))
    merged, note = _files_replace_a_presets_generator(merged, overrides)
    for override in overrides:
        merged = _merge_override(merged, override)
    data = _resolve(merged)
    _check_keys(data, Config)
    try:
        config = Config.model_validate(data)
    except ValidationError as error:
        raise ConfigError(_format_validation_error(error)) from None
    if note:
        print(note, file=sys.stderr)
    return config


def dump_config(config: Config) -> str:
    """The fully resolved config as YAML."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)


def config_changes(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """`key.sub: old -> new` for every setting that differs between two dumped configs."""
    changes = []
    for key in dict.fromkeys([*old, *new]):
        before, after = old.get(key), new.get(key)
        if isinstance(before, dict) and isinstance(after, dict):
            changes += config_changes(before, after, f"{prefix}{key}.")
        elif before != after:
            changes.append(f"{prefix}{key}: {before!r} -> {after!r}")
    return changes


def describe_config(config: BaseModel, prefix: str = "") -> list[str]:
    """`key.sub = value  # description` for every setting of `config`, keys dotted from `prefix`."""
    values = config.model_dump(mode="json")
    lines = []
    for name, field in type(config).model_fields.items():
        key, value = f"{prefix}{name}", getattr(config, name)
        if isinstance(value, BaseModel):
            lines += describe_config(value, f"{key}.")
        else:
            comment = f"  # {field.description}" if field.description else ""
            lines.append(f"{key} = {json.dumps(values[name])}{comment}")
    return lines
