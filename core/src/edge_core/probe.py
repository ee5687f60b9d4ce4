"""Probing: every plugin's backends, devices and pools, each plugin isolated with a timeout."""

from __future__ import annotations

from typing import Any

from edge_core.backend import ProbeReport
from edge_core.discovery import plugin_errors
from edge_core.plugins import PluginSet, probe_problem
from edge_core.pools import probe_host

__all__ = ["probe_all"]


def probe_all(plugins: PluginSet, *, timeout_s: float = 10.0) -> dict[str, Any]:
    """Call ``edge_probe`` on every plugin separately and gather a JSON-ready result.

    A plugin whose probe raises, hangs past ``timeout_s`` or returns something other than
    a list of probe reports (one item that is not one refuses the whole answer, as
    opening a pipeline does) is listed under ``plugin_errors``; its declared backends are
    then reported unavailable with that error as the reason, so nothing silently
    disappears.
    Backends a plugin declares but does not report on are marked unavailable too, and so
    is a report on a backend its plugin does not serve (:func:`_not_served`: the plugin's
    ``edge_backends`` failed or answered something else, or another plugin declares the
    name too): no stage can be bound to it, whatever the probe says. Every
    plugin that did not load follows in ``plugin_errors``, as ``edge run --json`` lists
    them; each row, either kind, is ``{"plugin", "error", "named_by"}``
    (:func:`edge_core.discovery.plugin_errors`: ``named_by`` says who named the plugin).
    Each backend's row lists its ``targets``: the ``placement.target`` values a stage of
    it may name (its ``BackendInfo.providers``; empty when it declares none or its plugin
    does not serve it).
    """
    rows: list[dict[str, Any]] = []
    failed_probes: list[dict[str, Any]] = []  # plugin rows, with the probe's error
    answered: set[str] = set()
    for answer in plugins.call_each("edge_probe", timeout_s=timeout_s):
        record = plugins.record(answer.plugin)
        problem = answer.error
        reports: list[ProbeReport] = []
        if problem is None:
            problem = probe_problem(answer.result)
            if problem is None and answer.result is not None:
                # a mixed answer is refused whole, as opening a pipeline refuses it
                # (PluginSet.probe): no row of it is reported available
                reports.extend(answer.result)
        if problem is not None:
            failed_probes.append({**record.to_json(), "error": problem})
        for report in reports:
            answered.add(report.backend)
            row: dict[str, Any] = {"plugin": answer.plugin, **report.to_json()}
            unserved = _not_served(plugins, answer.plugin, report.backend)
            if unserved is not None:
                row.update(available=False, reason=unserved, limitation=None)
            rows.append(row)
        for backend in record.backends:
            if backend not in answered:
                answered.add(backend)
                rows.append({
                    "plugin": answer.plugin, "backend": backend, "available": False,
                    "reason": f"probe failed: {problem}" if problem
                    else "probe gave no report for this backend",
                    "devices": [], "runtime": {}, "notes": [], "pool_totals": {},
                    "limitation": None,
                })
    errors = [*plugin_errors(failed_probes),
              *plugin_errors(record.to_json() for record in plugins.records)]
    rows.sort(key=lambda row: row["backend"])
    host = probe_host()
    pools = [pool.to_json() for pool in host.pools]
    known = {pool["name"] for pool in pools}
    for row in rows:
        for name, total in row.get("pool_totals", {}).items():
            if name not in known:
                known.add(name)
                pools.append({"name": name, "total": total, "within": None,
                              "observed_by": f"probe:{row['backend']}"})
    for pool in pools:
        pool["observed_total"] = pool.get("total")
    for row in rows:
        row["targets"] = _placement_targets(plugins, row["plugin"], row["backend"])
    return {"host": host.to_json(), "pools": pools, "backends": rows, "plugin_errors": errors}


def _placement_targets(plugins: PluginSet, plugin: str, backend: str) -> list[str]:
    """The ``placement.target`` values a stage of ``backend`` may name (``BackendInfo.providers``).

    Empty when the backend declares none (a stage's target is then not checked before the
    backend loads it) or when ``plugin`` does not serve it (no stage binds to it).
    """
    owner = plugins.backends.get(backend)
    return list(owner[0].providers) if owner is not None and owner[1] == plugin else []


def _not_served(plugins: PluginSet, plugin: str, backend: str) -> str | None:
    """Why ``plugin`` does not serve ``backend`` though it reported on it; ``None`` if it does.

    A stage binds only to a backend its plugin declared and nobody else did
    (:meth:`PluginSet.backends <edge_core.plugins.PluginSet>`); a probe cannot make one
    available that no stage could run on.
    """
    owner = plugins.backends.get(backend)
    if owner is not None and owner[1] == plugin:
        return None
    error = plugins.record(plugin).error
    if error:
        return f"plugin {plugin!r} does not serve it: {error}"
    return f"plugin {plugin!r} does not declare backend {backend!r} (edge_backends)"
