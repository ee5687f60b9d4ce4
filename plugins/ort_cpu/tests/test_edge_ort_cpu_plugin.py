from edge_core.plugins import load_plugins
from edge_core.probe import probe_all


def test_edge_ort_cpu_is_found_through_its_entry_point() -> None:
    plugins = load_plugins(env={"EDGE_PLUGINS": "ort-cpu"})
    record = plugins.record("ort-cpu")
    assert record.error is None
    assert record.distribution == "edge-ort-cpu"
    assert record.contract == "1.0"
    assert record.backends == ("ort-cpu",)
    assert "edge_probe" in record.hooks


def test_edge_ort_cpu_probe_says_plainly_it_is_not_implemented() -> None:
    plugins = load_plugins(env={"EDGE_PLUGINS": "ort-cpu"})
    rows = probe_all(plugins)["backends"]
    assert [r["backend"] for r in rows] == ["ort-cpu"]
    assert rows[0]["available"] is False
    assert "not implemented" in rows[0]["reason"]
