"""agentrl's SGLang requests and response parsing, checked against SGLang's own definitions.

`pip install sglang` (0.5.23) pulls torch 2.14.1 with CUDA 13 libraries, flashinfer and other GPU
wheels, so the package is not a CI dependency. The field lists below are taken from SGLang 0.5.23:
`sglang/api/v1/api_types.py` (the HTTP JSON contract, generated from `proto/sglang`; the server
checks every `/generate` body against it) and `sglang/srt/managers/io_struct.py`. The last test
decodes agentrl's requests and the built-in server's answers with SGLang's own decoders: those of
the installed `sglang` package if there is one, else `api_types.py` taken from the SGLANG_VERSION
wheel by `tests/fetch_sglang_api.sh` (part of the test set-up; it needs only msgspec).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from aiohttp import web

from agentrl.engine.protocol import FinishReason, Generation, SamplingParams
from agentrl.engine.remote.sglang_client import SGLangEngine
from agentrl.engine.remote.sglang_protocol import (
    SGLANG_VERSION,
    EngineRequestError,
    WireGenerateRequest,
    WireSamplingParams,
    WireUpdateWeightsFromDisk,
    generate_payload,
    generation_from_response,
    response_from_generation,
)


def names(text: str) -> frozenset[str]:
    return frozenset(text.split())


# sglang.api.v1.GenerateRequest (unknown keys ignored by SGLang)
GENERATE_REQUEST_FIELDS = names("""
    rid text input_ids stream sampling_params return_logprob logprob_start_len top_logprobs_num
    token_ids_logprob return_hidden_states return_text_in_logprobs bootstrap_host bootstrap_port
    bootstrap_room bootstrap_pair_key decode_tp_size routed_dp_rank disagg_prefill_dp_rank image_data
    mm_hashes video_data audio_data extra_key priority cache_salt require_reasoning lora_path
    session_params kv_hints routing_key max_thinking_tokens session_id custom_logit_processor
    custom_labels images_config return_prompt_token_ids routed_experts_start_len return_sampling_mask
    modalities""")
# sglang.api.v1.SamplingParams (unknown keys REJECTED by SGLang: a typo here is a 400 there)
SAMPLING_PARAMS_FIELDS = names("""
    max_new_tokens stop stop_token_ids stop_regex temperature top_p top_k min_p frequency_penalty
    presence_penalty repetition_penalty min_new_tokens n json_schema regex ebnf structural_tag
    ignore_eos skip_special_tokens spaces_between_special_tokens no_stop_trim stream_interval
    logit_bias sampling_seed custom_params beam_width watermark choice""")
# sglang.api.v1.GenerateResponse and GenerateMetaInfo
GENERATE_RESPONSE_FIELDS = names("text meta_info output_ids index prompt_token_ids")
GENERATE_META_INFO_FIELDS = names("""
    id prompt_tokens completion_tokens finish_reason output_token_logprobs input_token_logprobs
    output_top_logprobs input_top_logprobs output_token_ids_logprobs input_token_ids_logprobs
    hidden_states e2e_latency cached_tokens reasoning_tokens output_token_logprobs_length
    weight_version weight_versions image_tokens audio_tokens video_tokens""")
# sglang.api.v1.FinishStop / FinishLength / FinishAbort, told apart by "type"
FINISH_REASON_FIELDS = {
    "stop": {"matched"},
    "length": {"length"},
    "abort": {"message", "status_code", "err_type"},
}
# sglang.srt.managers.io_struct.UpdateWeightFromDiskReqInput (with BaseReq's rid, http_worker_ipc)
UPDATE_WEIGHTS_FROM_DISK_FIELDS = names("""
    rid http_worker_ipc model_path load_format abort_all_requests weight_version is_async
    torch_empty_cache keep_pause recapture_cuda_graph token_step flush_cache manifest""")
UPDATE_WEIGHTS_FROM_DISK_ANSWER = frozenset({"success", "message", "num_paused_requests"})
# sglang.api.v1.GetModelInfoResponse
MODEL_INFO_FIELDS = names("""
    model_path served_model_name tokenizer_path is_generation preferred_sampling_params weight_version
    load_format reasoning_parser tool_call_parser""")
# io_struct.ReleaseMemoryOccupationReqInput / ResumeMemoryOccupationReqInput
MEMORY_OCCUPATION_FIELDS = frozenset({"rid", "http_worker_ipc", "tags"})

EVERY_OPTION = SamplingParams(
    max_new_tokens=5, temperature=0.7, top_p=0.9, top_k=20, seed=11, stop_token_ids=(2, 7)
)

# An answer as SGLang 0.5.23's tokenizer manager builds it for return_logprob=True (no metrics).
SGLANG_ANSWER = {
    "text": " four",
    "output_ids": [31, 2],
    "meta_info": {
        "id": "8f3c",
        "finish_reason": {"type": "stop", "matched": 2},
        "prompt_tokens": 3,
        "weight_version": "4",
        "num_retractions": 0,
        "input_token_logprobs": [[None, 1, None], [-3.5, 9, None], [-1.25, 12, None]],
        "output_token_logprobs": [[-0.5, 31, None], [-0.125, 2, None]],
        "output_token_logprobs_length": 2,
        "reasoning_tokens": 0,
        "completion_tokens": 2,
        "cached_tokens": 0,
    },
}


def test_the_generate_body_is_token_in_with_logprobs_and_only_sglang_fields() -> None:
    body = generate_payload([1, 9, 12], EVERY_OPTION)
    assert body == {
        "input_ids": [1, 9, 12],
        "sampling_params": {
            "max_new_tokens": 5,
            "temperature": 0.7,
            "top_p": 0.9,
            "top_k": 20,
            "stop_token_ids": [2, 7],
            "sampling_seed": 11,
        },
        "return_logprob": True,
    }
    assert set(body) <= GENERATE_REQUEST_FIELDS
    assert set(body["sampling_params"]) <= SAMPLING_PARAMS_FIELDS


def test_an_sglang_answer_becomes_the_generation_it_describes() -> None:
    assert generation_from_response(SGLANG_ANSWER) == Generation(
        [31, 2], [-0.5, -0.125], FinishReason.STOP, 4
    )


def test_a_length_finish_is_a_length_generation() -> None:
    answer = {**SGLANG_ANSWER, "meta_info": {**SGLANG_ANSWER["meta_info"], "finish_reason": {"type": "length", "length": 2}}}  # fmt: skip
    assert generation_from_response(answer).finish_reason is FinishReason.LENGTH


@pytest.mark.parametrize(
    ("meta_change", "message"),
    [
        ({"finish_reason": {"type": "abort", "message": "out of memory"}}, "the server aborted the generation: out of memory"),
        ({"finish_reason": None}, "unfinished generation"),
        ({"weight_version": "default"}, "weight_version='default'; agentrl needs the decimal policy version"),
        ({"output_token_logprobs": None}, "without meta_info.output_token_logprobs"),
        ({"output_token_logprobs": [[None, 31, None], [-0.1, 2, None]]}, "a null logprob for a sampled token"),
        ({"output_token_logprobs": [[-0.5, 31]]}, "a body agentrl cannot read"),
    ],
)  # fmt: skip
def test_an_unusable_answer_raises_an_engine_error(meta_change: dict, message: str) -> None:
    answer = {**SGLANG_ANSWER, "meta_info": {**SGLANG_ANSWER["meta_info"], **meta_change}}
    with pytest.raises(EngineRequestError, match=message.replace("(", r"\(").replace(")", r"\)")):
        generation_from_response(answer)


def test_the_built_in_server_accepts_only_fields_sglang_defines() -> None:
    assert set(WireGenerateRequest.model_fields) <= GENERATE_REQUEST_FIELDS
    assert set(WireSamplingParams.model_fields) <= SAMPLING_PARAMS_FIELDS
    assert set(WireUpdateWeightsFromDisk.model_fields) <= UPDATE_WEIGHTS_FROM_DISK_FIELDS


def test_the_built_in_servers_answer_uses_only_fields_sglang_defines() -> None:
    for generation in [
        Generation([31, 2], [-0.5, -0.125], FinishReason.STOP, 4),
        Generation([31, 5], [-0.5, -0.25], FinishReason.LENGTH, 4),
    ]:
        answer = response_from_generation(
            generation, request_id="0", num_prompt_tokens=3, text="", return_logprob=True
        )
        assert set(answer) <= GENERATE_RESPONSE_FIELDS
        assert set(answer["meta_info"]) <= GENERATE_META_INFO_FIELDS
        finish = answer["meta_info"]["finish_reason"]
        assert set(finish) - {"type"} <= FINISH_REASON_FIELDS[finish["type"]]
        assert generation_from_response(answer) == generation  # and the client reads it back unchanged


async def test_weight_sync_and_memory_calls_send_only_sglang_fields_in_order(tmp_path: Path) -> None:
    """A recording server plays SGLang's answers; the client's requests are checked field by field."""
    calls: list[tuple[str, str, Any]] = []

    async def record(request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else None
        calls.append((request.method, request.path, body))
        if request.path == "/update_weights_from_disk":
            return web.json_response({"success": True, "message": "ok", "num_paused_requests": 0})
        if request.path == "/model_info":
            return web.json_response({"model_path": "m", "is_generation": True, "weight_version": "3"})
        return web.json_response(None)  # release/resume: FastAPI answers the handler's None as null

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", record)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    engine = SGLangEngine(f"http://{host}:{port}", model_path="m")
    try:
        await engine.update_weights_from_disk(tmp_path, version=3)
        await engine.release_memory_occupation(["weights", "kv_cache"])
        await engine.resume_memory_occupation()
    finally:
        await engine.close()
        await runner.cleanup()
    # No /flush_cache after the load: SGLang flushes inside it (UpdateWeightFromDiskReqInput.flush_cache
    # defaults to True) and answers a separate flush with 400 while any request runs. /model_info, not
    # the deprecated /get_model_info, which logs a warning on every call.
    assert calls == [
        ("POST", "/update_weights_from_disk", {"model_path": str(tmp_path), "weight_version": "3"}),
        ("GET", "/model_info", None),
        ("POST", "/release_memory_occupation", {"tags": ["weights", "kv_cache"]}),
        ("POST", "/resume_memory_occupation", {}),
    ]
    assert set(calls[0][2]) <= UPDATE_WEIGHTS_FROM_DISK_FIELDS
    assert set(calls[2][2]) <= MEMORY_OCCUPATION_FIELDS


async def test_a_model_info_with_another_version_fails_the_weight_sync(tmp_path: Path) -> None:
    async def answer(request: web.Request) -> web.Response:
        if request.path == "/model_info":
            return web.json_response({"weight_version": "2"})  # the load did not take
        return web.json_response({"success": True, "message": "ok", "num_paused_requests": 0})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    engine = SGLangEngine(f"http://{host}:{port}", model_path="m")
    try:
        with pytest.raises(
            EngineRequestError, match="server serves weight_version 2 after loading version 3"
        ):
            await engine.update_weights_from_disk(tmp_path, version=3)
    finally:
        await engine.close()
        await runner.cleanup()


FETCHED_API_TYPES = Path(__file__).resolve().parents[1] / ".sglang" / SGLANG_VERSION / "api_types.py"


def sglang_api_types() -> tuple[ModuleType, str]:
    """SGLang's generated HTTP contract module and its release: the installed package's, else the
    one `tests/fetch_sglang_api.sh` extracted from the SGLANG_VERSION wheel. Loaded by path, so
    `sglang/__init__.py` (which imports torch and GPU kernels) never runs."""
    spec = importlib.util.find_spec("sglang")
    if spec is not None and spec.submodule_search_locations:
        path = Path(spec.submodule_search_locations[0]) / "api" / "v1" / "api_types.py"
        version = importlib.metadata.version("sglang")
    else:
        path, version = FETCHED_API_TYPES, SGLANG_VERSION
    assert path.exists(), f"{path} is missing: run `bash tests/fetch_sglang_api.sh` (the test set-up does)"
    module_spec = importlib.util.spec_from_file_location("_sglang_api_types", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module, version


def test_sglangs_own_decoders_accept_agentrl_requests_and_the_built_in_servers_answers() -> None:
    api, version = sglang_api_types()
    request = api.GenerateRequest.from_json_value(generate_payload([1, 9, 12], EVERY_OPTION))
    assert (request.input_ids, request.return_logprob) == ([1, 9, 12], True)
    assert (request.sampling_params.sampling_seed, request.sampling_params.stop_token_ids) == (11, [2, 7])
    generation = Generation([31, 2], [-0.5, -0.125], FinishReason.STOP, 4)
    answer = response_from_generation(
        generation, request_id="0", num_prompt_tokens=3, text="", return_logprob=True
    )
    decoded = api.GenerateResponse.from_json_value(answer)
    assert [(e.logprob, e.token_id) for e in decoded.meta_info.output_token_logprobs] == [
        (-0.5, 31),
        (-0.125, 2),
    ]
    assert (decoded.meta_info.weight_version, decoded.meta_info.finish_reason) == (
        "4",
        api.FinishStop(matched=2),
    )
    assert api.GenerateResponse.from_json_value(SGLANG_ANSWER).meta_info.completion_tokens == 2
    if version == SGLANG_VERSION:  # the lists above are this release's
        assert set(api.GenerateRequest.__struct_fields__) == GENERATE_REQUEST_FIELDS
        assert set(api.SamplingParams.__struct_fields__) == SAMPLING_PARAMS_FIELDS
        assert set(api.GenerateResponse.__struct_fields__) == GENERATE_RESPONSE_FIELDS
        assert set(api.GenerateMetaInfo.__struct_fields__) == GENERATE_META_INFO_FIELDS
        assert set(api.GetModelInfoResponse.__struct_fields__) == MODEL_INFO_FIELDS
