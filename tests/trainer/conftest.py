"""Fixtures of the trainer tests."""

from pathlib import Path

import pytest
import torch

from tests.trainer.tiny_model import write_tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny_qwen2"))


@pytest.fixture
def one_thread():
    """One torch CPU thread for the test (policy-worker tests: faster on two cores, and repeatable)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
