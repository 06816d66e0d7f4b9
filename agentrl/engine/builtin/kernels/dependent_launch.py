"""Inference stage, programmatic dependent launch: a kernel is scheduled while the one before it drains.

In a decode step each kernel is short, and the GPU spends part of every kernel boundary idle:
the previous kernel's last programs finish, then the next kernel is scheduled and starts loading.
On Hopper and newer GPUs a kernel launched with `launch_pdl` may be scheduled as soon as every
program of the kernel before it has passed `wait_for_previous`; it then blocks in its own
`wait_for_previous` until that kernel has completed and its writes are visible. The wait also
covers every kernel before the previous one (each waited for its own predecessor), and a kernel
launched normally (cuBLAS, a torch operation) waits for everything ahead of it as always. Only a
kernel launched dependently releases the next one early; after one launched normally, the next
is scheduled when it completes.

So launching a kernel this way changes when it is scheduled, never what it reads or writes, as
long as before its wait it reads nothing the kernel just before it may write. When it starts,
every kernel before that one has completed (the one just before has passed its own wait): a
decode step's positions, written by its first kernel, can be read before the wait, and `prefetch`
can fetch what no kernel of the step writes (weights, keys and values of earlier positions).

Triton is imported only by the engine's CUDA kernel modules, and those only on CUDA.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

try:  # Triton releases since mid-2025
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    _TRITON_HAS_DEPENDENT_LAUNCH = True
except ImportError:  # older Triton: every kernel is launched normally, and these are never traced
    _TRITON_HAS_DEPENDENT_LAUNCH = False

    @triton.jit
    def gdc_wait():
        pass

    @triton.jit
    def gdc_launch_dependents():
        pass


@triton.jit
def wait_for_previous(DEPENDENT: tl.constexpr):
    """Block until the kernel before this one has completed, then let the next one be scheduled."""
    if DEPENDENT:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def prefetch(pointers):
    """Have L2 fetch the 128-byte lines at `pointers` (a tensor of addresses): a hint, which never
    changes what a later load reads, only how soon it arrives.

    A dependently launched kernel calls it before `wait_for_previous`, so those bytes travel from
    memory while the kernel before it still runs.
    """
    tl.inline_asm_elementwise(
        "prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [pointers], dtype=tl.int32, is_pure=False, pack=1
    )


def line_options(num_elements: int, tensor: torch.Tensor) -> dict:
    """`LINE` (elements of `tensor` in a 128-byte line) and `LINES_PAD` (lines covering a contiguous
    run of `num_elements`, rounded up to a power of two): where a kernel's `prefetch` points."""
    line = 128 // tensor.element_size()
    return {"LINE": line, "LINES_PAD": triton.next_power_of_2(-(-num_elements // line))}


@functools.cache
def _supported(device_index: int) -> bool:
    return _TRITON_HAS_DEPENDENT_LAUNCH and torch.cuda.get_device_capability(device_index) >= (9, 0)


def launch_options(device: torch.device, dependent: bool) -> dict:
    """Keyword arguments for a kernel that calls `wait_for_previous`.

    `dependent`: the kernel just before it in the stream is one of the engine's own, which releases
    it early. After any other kernel it is launched normally: launched dependently after cuBLAS
    products, the engine's kernels made the 0.5B single-turn benchmark slower (cuBLAS probably
    releases its dependents early, and their programs then wait beside it).
    """
    on = dependent and _supported(device.index if device.index is not None else torch.cuda.current_device())
    return {"DEPENDENT": True, "launch_pdl": True} if on else {"DEPENDENT": False}
