from edge_core.plugins import load_plugins
from edge_core.probe import probe_all


def test_edge_vllm_cuda_is_found_through_its_entry_point() -> None:
    plugins = load_plugins(env={"EDGE_PLUGINS": "vllm-cuda"})
    record = plugins.record("vllm-cuda")
    assert record.error is None
    assert record.distribution == "edge-vllm-cuda"
    assert record.contract == "1.0"
    assert record.backends == ("vllm-cuda",)
    assert "edge_probe" in record.hooks


def test_edge_vllm_cuda_probe_says_plainly_it_is_not_implemented() -> None:
    plugins = load_plugins(env={"EDGE_PLUGINS": "vllm-cuda"})
    rows = probe_all(plugins)["backends"]
    assert [r["backend"] for r in rows] == ["vllm-cuda"]
    assert rows[0]["available"] is False
    assert "not implemented" in rows[0]["reason"]
