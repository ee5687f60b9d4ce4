"""The vllm-cuda plugin without an engine: declaration, probe, options, demands, requests."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from edge_contracts.devices import RAM_POOL
from edge_core.cli.probe_cmd import state_words
from edge_core.config.structure import InvalidConfigError
from edge_core.ledger import CeilingAboveTotal, PoolExhausted, ResourceLedger
from edge_core.plugins import load_plugins
from edge_core.pools import Pool
from edge_core.probe import probe_all
from edge_core.stage import StageContext
from edge_vllm_cuda import plugin
from edge_vllm_cuda.demands import DemandRefused, estimate_demands, stage_demands
from edge_vllm_cuda.gpus import GpuProbe, GpuProbeError, parse_nvidia_smi, probe_gpus
from edge_vllm_cuda.options import VllmOptions
from edge_vllm_cuda.sampling import PARAM_NAMES, GenerateParamsInvalid, parse_generate_params
from edge_vllm_cuda.stage import VllmStage, worker_env

GIB = 1024**3
MIB = 1024**2
# Two GPUs as `nvidia-smi --query-gpu=index,uuid,name,memory.total,driver_version
# --format=csv,noheader,nounits` prints them (memory in MiB).
SMI_TWO_GPUS = (
    "0, GPU-0a1b2c3d-0000-1111-2222-333344445555, NVIDIA H200, 143771, 570.86.15\n"
    "1, GPU-9f8e7d6c-0000-1111-2222-333344445555, NVIDIA H200, 143771, 570.86.15\n"
)


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    """A model directory with a config and 3 MiB of weights (contents never loaded here)."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (tmp_path / "model.safetensors").write_bytes(b"\0" * (3 * MIB))
    return tmp_path


def two_gpus() -> GpuProbe:
    gpus, driver = parse_nvidia_smi(SMI_TWO_GPUS)
    return GpuProbe(gpus, "nvidia-smi", driver=driver)


def options(model_dir: Path, **values: object) -> VllmOptions:
    return plugin.edge_validate_stage("vllm-cuda", {"model": str(model_dir), **values},
                                      "stages[0].backend.options")


def test_entry_point_declares_a_preemptible_generate_backend() -> None:
    plugins = load_plugins(env={"EDGE_PLUGINS": "vllm-cuda"})
    record = plugins.record("vllm-cuda")
    assert record.error is None and record.distribution == "edge-vllm-cuda"
    assert record.backends == ("vllm-cuda",)
    info = plugin.backend_info()
    assert [k.value for k in info.kinds] == ["generate"] and info.preemptible
    assert info.max_concurrency == 64
    # the request parameters it reads are those parse_generate_params knows: a front end
    # refuses any other name before the stage sees it (edge serve's /run)
    assert info.params == PARAM_NAMES and {"prompt", "max_tokens", "json_schema"} <= info.params
    with pytest.raises(GenerateParamsInvalid, match="unknown parameter"):
        parse_generate_params({"prompt": "x", "max_tokns": 5})
    # docs/serve.md lists them as they are
    doc = (Path(__file__).resolve().parents[4] / "docs/serve.md").read_text(encoding="utf-8")
    listed = doc.split("a `vllm-cuda` stage reads its prompt", 1)[1].split("Any other name")[0]
    assert set(re.findall(r"`([a-z_]+)`", listed)) == PARAM_NAMES


def test_probe_without_gpus_is_available_for_cpu_stages_and_says_why_no_gpu() -> None:
    plugins = load_plugins(env={"EDGE_PLUGINS": "vllm-cuda"})
    row = probe_all(plugins)["backends"][0]
    assert row["backend"] == "vllm-cuda" and row["available"] is True
    probe = probe_gpus()
    if probe.gpus:  # a machine with GPUs lists each with its VRAM pool
        assert {d["physical_id"] for d in row["devices"]} == {g.uuid for g in probe.gpus}
        assert row["pool_totals"] == {g.pool: g.total_bytes for g in probe.gpus}
        assert row["limitation"] is None and state_words(row) == "available"
    else:
        assert row["devices"] == [] and row["pool_totals"] == {}
        assert any("no NVIDIA GPU seen" in note and "nvidia-smi" in note
                   for note in row["notes"])
        assert state_words(row) == "available (CPU only: no GPU found)"


def test_gpu_probe_names_each_method_that_failed() -> None:
    probe = probe_gpus("edge-test-no-such-nvidia-smi", use_nvml=False)
    assert probe.gpus == () and probe.source == "none"
    assert "nvidia-smi: command not found: 'edge-test-no-such-nvidia-smi'" in probe.why_none()


def test_nvidia_smi_output_becomes_gpus_with_vram_pools() -> None:
    probe = two_gpus()
    assert [g.index for g in probe.gpus] == [0, 1] and probe.driver == "570.86.15"
    assert probe.gpus[0].total_bytes == 143771 * MIB
    assert probe.gpus[1].pool == "machine:vram:GPU-9f8e7d6c-0000-1111-2222-333344445555"
    with pytest.raises(GpuProbeError, match="expected 5 fields"):
        parse_nvidia_smi("0, GPU-x, name\n")
    with pytest.raises(GpuProbeError, match="not a number"):
        parse_nvidia_smi("zero, GPU-x, name, 10, 1.0\n")


@pytest.mark.parametrize(("values", "message"), [
    ({"device": "cpu", "device_ids": [0]}, "device_ids: names GPUs but device is 'cpu'"),
    ({"tensor_parallel_size": 2, "device_ids": [0]}, "must name exactly"),
    ({"device_ids": [1, 1], "tensor_parallel_size": 2}, "a GPU may be named once only"),
    ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization: must be in (0, 1]"),
    ({"max_concurrency": 65}, "above the backend's maximum of 64"),
    ({"device": "rocm"}, "device"),
    ({"engine_stop_s": 0}, "engine_stop_s: must be in (0, 60] seconds"),
    ({"engine_stop_s": 61.0}, "engine_stop_s: must be in (0, 60] seconds"),
    ({"engine_stop_s": True}, "engine_stop_s"),
])
def test_invalid_engine_settings_are_refused_with_their_path(
        model_dir: Path, values: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidConfigError) as caught:
        options(model_dir, **values)
    assert "stages[0].backend.options" in str(caught.value)
    assert message in str(caught.value)


def test_a_model_path_without_config_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidConfigError, match=r"no config\.json"):
        plugin.edge_validate_stage("vllm-cuda", {"model": str(tmp_path)}, "opts")


def test_cpu_platform_charges_host_ram_for_base_weights_and_kv_cache(model_dir: Path) -> None:
    opts = options(model_dir, device="cpu", kv_cache_space_gib=2)
    demands = estimate_demands(opts, GpuProbe((), "none"), "opts")
    assert demands == {RAM_POOL: opts.ram_base_bytes + 3 * MIB + 2 * GIB}


def test_tensor_parallel_charges_each_gpu_its_share_plus_headroom(model_dir: Path) -> None:
    opts = options(model_dir, tensor_parallel_size=2, gpu_memory_utilization=0.5)
    probe = two_gpus()
    demands = estimate_demands(opts, probe, "opts")
    share = -(-probe.gpus[0].total_bytes // 2) + opts.vram_headroom_bytes
    assert demands == {probe.gpus[0].pool: share, probe.gpus[1].pool: share,
                       RAM_POOL: opts.ram_base_bytes + 3 * MIB}


def test_tensor_parallel_reservation_is_atomic_over_the_gpus(model_dir: Path) -> None:
    opts = options(model_dir, tensor_parallel_size=2, gpu_memory_utilization=0.5)
    probe = two_gpus()
    ledger = ResourceLedger([Pool(RAM_POOL, 64 * GIB)]
                            + [Pool(g.pool, g.total_bytes) for g in probe.gpus])
    squatter = ledger.reserve("other", {probe.gpus[1].pool: probe.gpus[1].total_bytes // 2})
    with pytest.raises(PoolExhausted) as caught:
        ledger.reserve("gen", estimate_demands(opts, probe, "opts"))
    assert probe.gpus[1].pool in str(caught.value)
    assert ledger.reserved(probe.gpus[0].pool) == 0 and ledger.reserved(RAM_POOL) == 0
    ledger.release(squatter, verified=True)
    token = ledger.reserve("gen", estimate_demands(opts, probe, "opts"))
    assert ledger.reserved(probe.gpus[0].pool) > 0 and ledger.reserved(probe.gpus[1].pool) > 0
    ledger.release(token, verified=True)
    assert ledger.is_empty()


def test_a_vram_ceiling_above_the_physical_total_is_refused() -> None:
    gpu = two_gpus().gpus[0]
    with pytest.raises(CeilingAboveTotal, match="above the observed total"):
        ResourceLedger([Pool(gpu.pool, gpu.total_bytes)], {gpu.pool: gpu.total_bytes + 1})


def test_demands_beyond_a_gpu_or_below_the_estimate_are_refused(model_dir: Path) -> None:
    probe = two_gpus()
    gpu = probe.gpus[0]
    with pytest.raises(DemandRefused, match="exceeds its physical total"):
        estimate_demands(options(model_dir, gpu_memory_utilization=1.0), probe, "opts")
    opts = options(model_dir)
    with pytest.raises(DemandRefused, match="above the GPU's physical total"):
        stage_demands(opts, probe, {gpu.pool: gpu.total_bytes + 1}, "opts", "demands")
    with pytest.raises(DemandRefused, match="below the plugin's estimate"):
        stage_demands(opts, probe, {RAM_POOL: 1}, "opts", "demands")
    raised = stage_demands(opts, probe, {RAM_POOL: 100 * GIB}, "opts", "demands")
    assert raised[RAM_POOL] == 100 * GIB and gpu.pool in raised


def test_a_cuda_stage_without_that_gpu_is_refused_at_reserve_with_the_probe_reason(
        model_dir: Path) -> None:
    opts = options(model_dir, device_ids=[3])
    with pytest.raises(DemandRefused) as caught:
        estimate_demands(opts, two_gpus(), "stages[0].backend.options")
    assert "stages[0].backend.options.device_ids[0]: no NVIDIA GPU with index 3" in str(
        caught.value)
    context = StageContext(pipeline="p", stage_id="gen", backend="vllm-cuda",
                           options=options(model_dir))
    if not probe_gpus().gpus:
        with pytest.raises(DemandRefused, match="no NVIDIA GPU with index 0"):
            plugin.edge_reserve(context)


def test_worker_sees_exactly_the_requested_gpus_in_bus_order(model_dir: Path) -> None:
    probe = two_gpus()
    env = worker_env(options(model_dir, device_ids=[1]), (probe.gpus[1],), base={})
    assert env["CUDA_VISIBLE_DEVICES"] == "1" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["VLLM_HOST_IP"] == "127.0.0.1"
    cpu = worker_env(options(model_dir, device="cpu", kv_cache_space_gib=3), (), base={})
    assert cpu["VLLM_CPU_KVCACHE_SPACE"] == "3" and "CUDA_VISIBLE_DEVICES" not in cpu


def test_the_worker_gets_declared_names_not_the_controllers_whole_environment(
    model_dir: Path,
) -> None:
    base = {"CLOUD_TOKEN": "secret", "VLLM_LOGGING_LEVEL": "DEBUG", "PATH": "/bin"}
    env = worker_env(options(model_dir, device="cpu"), (), base=base)
    assert "CLOUD_TOKEN" not in env and "PATH" not in env  # the host's allowlist adds PATH
    assert env["VLLM_LOGGING_LEVEL"] == "DEBUG"  # a user's choice wins over the default
    assert {"VLLM_*", "CUDA_*", "HF_*"} <= set(VllmStage.worker_env_names)


def test_generate_params_take_one_prompt_form_and_checked_sampling() -> None:
    parsed = parse_generate_params({"prompt_token_ids": [1, 2], "max_tokens": 3,
                                    "temperature": 0, "stop": "x"})
    assert parsed.engine_prompt() == {"prompt_token_ids": [1, 2]}
    assert parsed.sampling_kwargs()["stop"] == ["x"]
    assert parse_generate_params({"prompt": "hi"}).engine_prompt() == {"prompt": "hi"}
    for bad, field in [({}, "prompt"), ({"prompt": "a", "prompt_token_ids": [1]}, "prompt"),
                       ({"prompt_token_ids": [1, -2]}, "prompt_token_ids"),
                       ({"prompt": "a", "max_tokens": 0}, "max_tokens"),
                       ({"prompt": "a", "top_p": 0.0}, "top_p"),
                       ({"prompt": "a", "temperature": float("nan")}, "temperature"),
                       ({"prompt": "a", "beam": 2}, "beam")]:
        with pytest.raises(GenerateParamsInvalid) as caught:
            parse_generate_params(bad)
        assert caught.value.field == field
        assert str(caught.value).startswith(f"params.{field}: ")


def test_every_problem_of_a_request_is_named_at_once() -> None:
    """A misspelt ``temprature`` and a bad ``temperature``: both in one error."""
    with pytest.raises(GenerateParamsInvalid) as caught:
        parse_generate_params({"prompt": "hi", "temprature": 0.5, "temperature": -1,
                               "top_p": 2})
    assert [p.field for p in caught.value.problems] == ["temprature", "temperature", "top_p"]
    message = str(caught.value)
    assert message.startswith("params.temprature: unknown parameter")
    assert "params.temperature: must be a number in [0.0, 100.0]: -1" in message
    assert "params.top_p: " in message
