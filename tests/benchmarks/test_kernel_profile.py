import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from kernel_profile import NO_PROJECT_CODE, HostCall, Kernel, KernelProfile, Profiled, format_profile, kind_of

from agentrl.engine.builtin.runner.step_inputs import PrefillRows, prefill_inputs


def test_kernel_names_seen_on_an_h100_fall_into_their_kinds():
    kinds = {
        "nvjet_sm90_tst_128x256_64x4_1x2_h_bz_coopA_NNN": "matmul",
        "void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16>": "matmul",
        "void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<64>>": "attention",
        "_split_attention": "attention",
        "_merge_splits": "attention",
        "triton_poi_fused__unsafe_view_mul_silu_silu_backward_view_0": "compiled (triton)",
        "_add_rms_norm": "norm",
        "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>": "optimizer, foreach",
        "Memcpy DtoD (Device -> Device)": "copy",
        "_silu_and_multiply": "activation, rotary",
        "_rotary_store": "activation, rotary",
        "_block_statistics": "other",
    }  # fmt: skip
    assert {name: kind_of(name) for name in kinds} == kinds


def synthetic() -> KernelProfile:
    # two streams overlap at 30-40; nothing runs at 50-60 and 75-95
    kernels = (
        Kernel("nvjet_a", 10.0, 40.0),
        Kernel("flash_fwd", 30.0, 50.0),
        Kernel("nvjet_a", 60.0, 70.0),
        Kernel("_add_rms_norm", 65.0, 75.0),
        Kernel("Memcpy HtoD", 95.0, 100.0),
    )
    return KernelProfile(wall_s=0.5, kernels=kernels)


def test_time_by_kind_longest_kernels_span_and_gaps_of_overlapping_streams():
    profile = synthetic()
    assert profile.span_us == 90.0
    assert profile.time_by_kind() == {"matmul": 40.0, "attention": 20.0, "norm": 10.0, "copy": 5.0}
    assert profile.longest(2) == [("nvjet_a", 40.0, 2), ("flash_fwd", 20.0, 1)]
    gaps = [(gap.duration_us, gap.after, gap.before) for gap in profile.gaps()]
    assert gaps == [(10.0, "flash_fwd", "nvjet_a"), (20.0, "_add_rms_norm", "Memcpy HtoD")]


def test_the_printed_profile_gives_totals_kinds_and_the_longest_gap_first():
    lines = format_profile(synthetic(), longest=1, gaps=1).splitlines()
    assert lines[0] == (
        "profile: 500.0 ms under the profiler; 5 kernels, 0.1 ms of kernel time; "
        "first-to-last kernel 0.1 ms, 0.0 ms of it with no kernel running"
    )
    assert lines[1].split() == ["matmul", "0.0", "ms", "53.3%"]
    assert lines[-1].split()[:3] == ["0.02", "ms", "after"] and "_add_rms_norm" in lines[-1]


def test_a_cpu_region_is_timed_and_records_no_gpu_kernels():
    with Profiled(torch.device("cpu")) as region:
        torch.ones(256, 256) @ torch.ones(256, 256)
    assert region.result is not None and region.result.kernels == () and region.result.wall_s > 0
    assert format_profile(region.result).endswith("no GPU kernels recorded (CPU run)")


def test_idle_gaps_are_attributed_to_the_project_code_each_thread_ran_at_their_middle():
    kernels = (Kernel("nvjet_a", 0.0, 100.0), Kernel("nvjet_a", 200.0, 300.0), Kernel("nvjet_a", 310.0, 400.0),
               Kernel("nvjet_a", 500.0, 600.0))  # fmt: skip
    scheduler, caller = 1, 2
    calls = (
        HostCall("agentrl/engine/scheduler.py(70): serve", scheduler, 0.0, 1000.0),
        HostCall("agentrl/engine/scheduler.py(167): _launch_decode", scheduler, 120.0, 190.0),
        HostCall("agentrl/engine/decode_graphs.py(86): run", scheduler, 140.0, 180.0),
        HostCall("agentrl/engine/transformers_engine.py(162): generate", caller, 145.0, 160.0),
        HostCall("agentrl/engine/scheduler.py(120): _prefill", scheduler, 420.0, 470.0),
    )
    profile = KernelProfile(wall_s=0.001, kernels=kernels, host_calls=calls)
    # gaps: 100-200 (middle 150: both threads busy), 300-310 (too short), 400-500 (middle 450: the prefill)
    assert profile.idle_by_host_code() == {
        "scheduler.py(70): serve > scheduler.py(167): _launch_decode > decode_graphs.py(86): run": 100.0,
        "transformers_engine.py(162): generate": 100.0,
        "scheduler.py(70): serve > scheduler.py(120): _prefill": 100.0,
    }
    assert KernelProfile(0.001, kernels, calls[4:]).idle_by_host_code() == {
        NO_PROJECT_CODE: 100.0,
        "scheduler.py(120): _prefill": 100.0,
    }
    assert format_profile(profile).splitlines()[-4].endswith("by the project code running then:")


def test_a_region_profiled_with_host_stacks_records_the_project_calls_it_made():
    with Profiled(torch.device("cpu"), host_stacks=True) as region:
        prefill_inputs(PrefillRows.of([[1, 2, 3], [4, 5]], [0, 1], first_slot=0))
    names = [call.name for call in region.result.host_calls]
    assert any(
        "agentrl/engine/builtin/runner/step_inputs.py(" in name and name.endswith("): prefill_inputs")
        for name in names
    )
    assert all("agentrl/" in name or "benchmarks/" in name for name in names)
