"""engine.device and trainer.device: auto picks CUDA where it exists, and asking for a missing GPU is named."""

from __future__ import annotations

import pytest
import torch

from agentrl.devices import resolve_device


def test_auto_is_cuda_where_cuda_is_available_and_cpu_elsewhere(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto", "engine.device") == "cuda"
    assert resolve_device("cpu", "engine.device") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto", "engine.device") == "cpu"


def test_cuda_without_cuda_names_the_setting_and_the_fix(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(
        ValueError, match=r"^trainer.device=cuda but CUDA is not available here; set trainer.device=cpu"
    ):
        resolve_device("cuda", "trainer.device")
