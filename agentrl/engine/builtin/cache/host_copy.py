"""Inference stage: host values to the device without waiting for the work queued before the copy.

A copy from pageable host memory makes the host wait until the device has finished all the work
queued before it; with decode steps overlapped, that would be the step in flight. From pinned
memory the copy is queued behind that work like a kernel, and the host goes on at once.
"""

from __future__ import annotations

import torch


def to_device(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """`values` (a list, or nested lists) as a `dtype` tensor on `device`."""
    return tensor_to_device(torch.tensor(values, dtype=dtype), device)


def tensor_to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`tensor` on `device`; from the host to CUDA through pinned memory."""
    if device.type != "cuda" or tensor.device.type != "cpu":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)
