"""Operating conditions: host load, CPU frequency, temperature, power, read while measuring.

A measurement means little without the conditions it was taken under: a loaded host, a
CPU that lowered its clock, a laptop on battery in a power-saving mode. This module reads
what the kernel exposes, without privileges:

- **load**: the 1/5/15-minute load averages (``os.getloadavg``);
- **CPU frequency** per logical CPU from ``<sysfs>/devices/system/cpu/cpuN/cpufreq``
  (``scaling_governor``, ``scaling_cur_freq``, ``scaling_min_freq``/``scaling_max_freq``,
  ``scaling_driver``, ``energy_performance_preference``), else the ``cpu MHz`` lines of
  ``/proc/cpuinfo`` (a virtual machine often has only these: no governor), else
  ``unavailable``;
- **thermal zones**: ``<sysfs>/class/thermal/thermal_zoneN/{type,temp}`` (°C);
- **power source**: ``<sysfs>/class/power_supply/*/{type,online,status,capacity}``;
- **power mode**: ``<sysfs>/firmware/acpi/platform_profile`` (and its choices).

Each part that the machine does not expose says ``"unavailable"`` with where it looked —
never an empty reading that could pass for "cool and idle". The sysfs root is ``/sys``,
or :data:`SYSFS_ENV` when set, or the ``sysfs`` argument (tests point it at faked entries).

:func:`snapshot` reads everything once; :func:`summarise` compares the snapshots taken
during a run (before, samples, after): load before and after, the frequency range per CPU
and whether the governor or the frequency changed, the hottest temperature.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["SYSFS_ENV", "UNAVAILABLE", "frequency", "hottest", "mean_mhz", "power",
           "snapshot", "summarise", "sysfs_root", "thermal"]

SYSFS_ENV = "EDGE_SYSFS_ROOT"
"""Environment variable naming another sysfs root (tests fake ``/sys`` entries there)."""

UNAVAILABLE = "unavailable"
"""What a part of the conditions says when the machine does not expose it."""

_CPU_DIR = re.compile(r"cpu(\d+)$")
_ZONE_DIR = re.compile(r"thermal_zone(\d+)$")


def sysfs_root(sysfs: str | os.PathLike[str] | None = None) -> Path:
    """The sysfs root: ``sysfs`` when given, else ``$EDGE_SYSFS_ROOT``, else ``/sys``."""
    if sysfs is not None:
        return Path(sysfs)
    return Path(os.environ.get(SYSFS_ENV) or "/sys")


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None


def _number(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text.split()[0])
    except (ValueError, IndexError):
        return None


def _sorted_dirs(folder: Path, pattern: re.Pattern[str]) -> list[tuple[int, Path]]:
    try:
        entries = list(folder.iterdir())
    except OSError:
        return []
    found = [(int(m.group(1)), p) for p in entries if (m := pattern.match(p.name))]
    return sorted(found)


def _proc_cpuinfo_mhz() -> dict[str, float]:
    found: dict[str, float] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            cpu = None
            for line in info:
                key, _, value = line.partition(":")
                key = key.strip().lower()
                if key == "processor":
                    cpu = value.strip()
                elif key == "cpu mhz" and cpu is not None:
                    try:
                        found[f"cpu{cpu}"] = round(float(value), 1)
                    except ValueError:
                        continue
    except OSError:
        return {}
    return found


def frequency(sysfs: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Per logical CPU: governor, current/min/max MHz, driver, energy preference.

    ``source`` says where it came from: ``sysfs`` (cpufreq), ``proc-cpuinfo`` (the
    current MHz only: no governor there) or :data:`UNAVAILABLE`.
    """
    root = sysfs_root(sysfs)
    cpus: dict[str, dict[str, Any]] = {}
    for index, folder in _sorted_dirs(root / "devices" / "system" / "cpu", _CPU_DIR):
        freq = folder / "cpufreq"
        if not freq.is_dir():
            continue
        current = _number(_read(freq / "scaling_cur_freq"))
        entry: dict[str, Any] = {
            "governor": _read(freq / "scaling_governor"),
            "current_mhz": round(current / 1000, 1) if current is not None else None,
            "min_mhz": _khz_to_mhz(_read(freq / "scaling_min_freq")),
            "max_mhz": _khz_to_mhz(_read(freq / "scaling_max_freq")),
            "driver": _read(freq / "scaling_driver"),
            "energy_performance_preference": _read(freq / "energy_performance_preference"),
        }
        cpus[f"cpu{index}"] = entry
    if cpus:
        return {"source": "sysfs", "cpus": cpus}
    if sysfs is None and os.environ.get(SYSFS_ENV) is None:
        mhz = _proc_cpuinfo_mhz()
        if mhz:
            return {"source": "proc-cpuinfo", "governor": UNAVAILABLE,
                    "cpus": {cpu: {"current_mhz": value} for cpu, value in mhz.items()}}
    return {"source": UNAVAILABLE,
            "looked_in": str(root / "devices" / "system" / "cpu" / "cpuN" / "cpufreq")}


def _khz_to_mhz(text: str | None) -> float | None:
    value = _number(text)
    return round(value / 1000, 1) if value is not None else None


def thermal(sysfs: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Every thermal zone's type and temperature (°C), or :data:`UNAVAILABLE`."""
    root = sysfs_root(sysfs)
    zones: dict[str, dict[str, Any]] = {}
    for index, folder in _sorted_dirs(root / "class" / "thermal", _ZONE_DIR):
        millidegrees = _number(_read(folder / "temp"))
        zones[f"thermal_zone{index}"] = {
            "type": _read(folder / "type"),
            "celsius": round(millidegrees / 1000, 1) if millidegrees is not None else None,
        }
    if not zones:
        return {"source": UNAVAILABLE, "looked_in": str(root / "class" / "thermal")}
    return {"source": "sysfs", "zones": zones}


def power(sysfs: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """The power supplies (mains, battery: online, status, capacity) and the power mode."""
    root = sysfs_root(sysfs)
    supplies: dict[str, dict[str, Any]] = {}
    folder = root / "class" / "power_supply"
    try:
        entries = sorted(folder.iterdir())
    except OSError:
        entries = []
    for entry in entries:
        kind = _read(entry / "type")
        if kind is None:
            continue
        supplies[entry.name] = {"type": kind, "online": _number(_read(entry / "online")),
                                "status": _read(entry / "status"),
                                "capacity_percent": _number(_read(entry / "capacity"))}
    profile_file = root / "firmware" / "acpi" / "platform_profile"
    mode = _read(profile_file)
    choices = _read(root / "firmware" / "acpi" / "platform_profile_choices")
    found: dict[str, Any] = {}
    if supplies:
        mains = [s for s in supplies.values() if s["type"] == "Mains"]
        on_mains = any(s["online"] == 1 for s in mains) if mains else None
        battery = [s for s in supplies.values() if s["type"] == "Battery"]
        found["source"] = ("mains" if on_mains else "battery" if battery and on_mains is False
                           else "unknown")
        found["supplies"] = supplies
    else:
        found["source"] = UNAVAILABLE
        found["looked_in"] = str(folder)
    if mode is not None:
        found["mode"] = mode
        found["mode_choices"] = choices.split() if choices else None
    else:
        found["mode"] = UNAVAILABLE
    return found


def snapshot(sysfs: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Load, frequency, thermal zones and power, read now (``at``: monotonic seconds)."""
    try:
        load = [round(v, 2) for v in os.getloadavg()]
    except OSError:
        load = None
    return {"at": time.monotonic(), "wall": time.time(), "load_average": load,
            "frequency": frequency(sysfs), "thermal": thermal(sysfs), "power": power(sysfs)}


def hottest(shot: Mapping[str, Any]) -> float | None:
    """The highest zone temperature of one snapshot (°C), or None."""
    zones = (shot.get("thermal") or {}).get("zones") or {}
    temps = [z["celsius"] for z in zones.values() if isinstance(z.get("celsius"), int | float)]
    return max(temps) if temps else None


def mean_mhz(shot: Mapping[str, Any]) -> float | None:
    """The mean current frequency over the CPUs of one snapshot (MHz), or None."""
    cpus = (shot.get("frequency") or {}).get("cpus") or {}
    values = [c["current_mhz"] for c in cpus.values()
              if isinstance(c.get("current_mhz"), int | float)]
    return round(sum(values) / len(values), 1) if values else None


def summarise(shots: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What changed over a run's snapshots (the first is "before", the last "after").

    ``frequency``: per CPU the lowest and highest current MHz seen, the governors seen,
    and ``changed`` (any governor or current frequency that differed between snapshots);
    ``temperature_c``: lowest and highest of the hottest zone; ``load_average``: before
    and after; each ``unavailable`` where the machine exposes nothing.
    """
    if not shots:
        return {"snapshots": 0}
    first, last = shots[0], shots[-1]
    per_cpu: dict[str, dict[str, Any]] = {}
    governors: set[str] = set()
    for shot in shots:
        for cpu, entry in ((shot.get("frequency") or {}).get("cpus") or {}).items():
            row = per_cpu.setdefault(cpu, {"min_mhz": None, "max_mhz": None,
                                           "governors": set()})
            mhz = entry.get("current_mhz")
            if isinstance(mhz, int | float):
                row["min_mhz"] = mhz if row["min_mhz"] is None else min(row["min_mhz"], mhz)
                row["max_mhz"] = mhz if row["max_mhz"] is None else max(row["max_mhz"], mhz)
            governor = entry.get("governor")
            if isinstance(governor, str):
                row["governors"].add(governor)
                governors.add(governor)
    source = (first.get("frequency") or {}).get("source", UNAVAILABLE)
    if per_cpu:
        changed = any(len(r["governors"]) > 1 or (r["min_mhz"] is not None
                                                   and r["min_mhz"] != r["max_mhz"])
                      for r in per_cpu.values())
        freq: dict[str, Any] = {
            "source": source, "changed": changed,
            "governors": sorted(governors) or UNAVAILABLE,
            "cpus": {cpu: {"min_mhz": r["min_mhz"], "max_mhz": r["max_mhz"],
                           "governors": sorted(r["governors"]) or UNAVAILABLE}
                     for cpu, r in per_cpu.items()},
        }
    else:
        freq = {"source": UNAVAILABLE, "changed": UNAVAILABLE}
    temps = [t for t in (hottest(s) for s in shots) if t is not None]
    temperature: dict[str, Any] | str = (
        {"hottest_min_c": min(temps), "hottest_max_c": max(temps),
         "zones": sorted((first.get("thermal") or {}).get("zones") or {})}
        if temps else UNAVAILABLE)
    return {
        "snapshots": len(shots),
        "seconds": round(float(last.get("at", 0.0)) - float(first.get("at", 0.0)), 3),
        "load_average": {"before": first.get("load_average"),
                         "after": last.get("load_average")},
        "frequency": freq,
        "temperature_c": temperature,
        "power": {"before": first.get("power"), "after": last.get("power"),
                  "changed": first.get("power") != last.get("power")},
    }
