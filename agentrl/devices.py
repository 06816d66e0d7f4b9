"""Set-up, where work runs: a device setting ("auto", "cpu" or "cuda") resolved for this machine."""

from __future__ import annotations

import torch


def resolve_device(device: str, setting: str) -> str:
    """`device`, with auto as cuda where CUDA is available, else cpu; `setting` (engine.device) names it in errors."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{setting}=cuda but CUDA is not available here; set {setting}=cpu (or auto)")
    return device
