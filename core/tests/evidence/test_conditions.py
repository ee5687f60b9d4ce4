"""Operating conditions read from a faked sysfs root, and `unavailable` where there is none."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from edge_core.evidence import conditions


def fake_sysfs(root: Path, *, mhz: tuple[int, int] = (2400, 1800), governor: str = "powersave",
               temp_c: float = 61.5, on_mains: bool = False) -> Path:
    """A sysfs tree with two cpufreq CPUs, two thermal zones, mains and a battery."""
    for cpu, value in enumerate(mhz):
        freq = root / "devices" / "system" / "cpu" / f"cpu{cpu}" / "cpufreq"
        freq.mkdir(parents=True, exist_ok=True)
        (freq / "scaling_governor").write_text(f"{governor}\n")
        (freq / "scaling_cur_freq").write_text(f"{value * 1000}\n")
        (freq / "scaling_min_freq").write_text("400000\n")
        (freq / "scaling_max_freq").write_text("4800000\n")
        (freq / "scaling_driver").write_text("intel_pstate\n")
        (freq / "energy_performance_preference").write_text("balance_power\n")
    (root / "devices" / "system" / "cpu" / "cpufreq").mkdir(exist_ok=True)  # not a CPU
    for zone, (kind, celsius) in enumerate((("x86_pkg_temp", temp_c), ("acpitz", 40.0))):
        folder = root / "class" / "thermal" / f"thermal_zone{zone}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "type").write_text(f"{kind}\n")
        (folder / "temp").write_text(f"{int(celsius * 1000)}\n")
    (root / "class" / "thermal" / "cooling_device0").mkdir(exist_ok=True)  # not a zone
    supply = root / "class" / "power_supply"
    (supply / "AC").mkdir(parents=True, exist_ok=True)
    (supply / "AC" / "type").write_text("Mains\n")
    (supply / "AC" / "online").write_text("1\n" if on_mains else "0\n")
    (supply / "BAT0").mkdir(exist_ok=True)
    (supply / "BAT0" / "type").write_text("Battery\n")
    (supply / "BAT0" / "status").write_text("Discharging\n")
    (supply / "BAT0" / "capacity").write_text("81\n")
    acpi = root / "firmware" / "acpi"
    acpi.mkdir(parents=True, exist_ok=True)
    (acpi / "platform_profile").write_text("low-power\n")
    (acpi / "platform_profile_choices").write_text("low-power balanced performance\n")
    return root


def test_a_faked_sysfs_gives_governor_frequency_temperature_power_and_mode(
        tmp_path: Path) -> None:
    shot = conditions.snapshot(fake_sysfs(tmp_path))
    freq = shot["frequency"]
    assert freq["source"] == "sysfs"
    assert freq["cpus"]["cpu0"] == {"governor": "powersave", "current_mhz": 2400.0,
                                    "min_mhz": 400.0, "max_mhz": 4800.0,
                                    "driver": "intel_pstate",
                                    "energy_performance_preference": "balance_power"}
    assert set(freq["cpus"]) == {"cpu0", "cpu1"}
    assert shot["thermal"]["zones"]["thermal_zone0"] == {"type": "x86_pkg_temp",
                                                        "celsius": 61.5}
    assert conditions.hottest(shot) == 61.5
    assert conditions.mean_mhz(shot) == 2100.0
    power = shot["power"]
    assert power["source"] == "battery"
    assert power["supplies"]["BAT0"]["capacity_percent"] == 81
    assert power["mode"] == "low-power"
    assert power["mode_choices"] == ["low-power", "balanced", "performance"]
    assert len(shot["load_average"]) == 3


def test_the_environment_variable_points_at_the_sysfs_root(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(conditions.SYSFS_ENV, str(fake_sysfs(tmp_path, on_mains=True)))
    shot = conditions.snapshot()
    assert shot["power"]["source"] == "mains"
    assert shot["thermal"]["source"] == "sysfs"


def test_a_machine_without_them_says_unavailable(tmp_path: Path) -> None:
    shot = conditions.snapshot(tmp_path)  # an empty sysfs: what this VM has of the three
    assert shot["thermal"]["source"] == conditions.UNAVAILABLE
    assert shot["power"]["source"] == conditions.UNAVAILABLE
    assert shot["power"]["mode"] == conditions.UNAVAILABLE
    assert shot["frequency"]["source"] == conditions.UNAVAILABLE
    summary = conditions.summarise([shot, conditions.snapshot(tmp_path)])
    assert summary["temperature_c"] == conditions.UNAVAILABLE
    assert summary["frequency"] == {"source": conditions.UNAVAILABLE,
                                    "changed": conditions.UNAVAILABLE}


def test_a_frequency_or_governor_change_during_a_run_is_seen(tmp_path: Path) -> None:
    before = conditions.snapshot(fake_sysfs(tmp_path / "a"))
    time.sleep(0.01)
    same = conditions.snapshot(fake_sysfs(tmp_path / "a"))
    assert conditions.summarise([before, same])["frequency"]["changed"] is False
    lower = conditions.snapshot(fake_sysfs(tmp_path / "b", mhz=(1200, 1800), temp_c=88.0))
    summary = conditions.summarise([before, lower])
    assert summary["frequency"]["changed"] is True
    assert summary["frequency"]["cpus"]["cpu0"] == {"min_mhz": 1200.0, "max_mhz": 2400.0,
                                                    "governors": ["powersave"]}
    assert summary["temperature_c"]["hottest_max_c"] == 88.0
    governed = conditions.snapshot(fake_sysfs(tmp_path / "c", governor="performance"))
    assert conditions.summarise([before, governed])["frequency"]["governors"] == [
        "performance", "powersave"]
    assert summary["seconds"] >= 0.0


def test_this_machine_reads_without_error() -> None:
    shot = conditions.snapshot()
    assert shot["frequency"]["source"] in ("sysfs", "proc-cpuinfo", conditions.UNAVAILABLE)
    assert conditions.summarise([shot])["snapshots"] == 1
