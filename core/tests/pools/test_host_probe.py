"""What the controller observes about its own host: domain, RAM pool(s), CPU."""

from __future__ import annotations

import json
import subprocess
import sys

import psutil
import pytest

from edge_contracts.devices import RAM_POOL, WSL_QUOTA, DeviceKind, ExecutionDomain
from edge_core.pools import detect_execution_domain, host_cpu, observe_host_pools, probe_host


@pytest.mark.parametrize(
    ("platform_name", "release", "environ", "expected"),
    [
        ("win32", "10", {}, ExecutionDomain.WINDOWS),
        ("cygwin", "3.4", {}, ExecutionDomain.WINDOWS),
        ("darwin", "23.1.0", {}, ExecutionDomain.POSIX),
        ("linux", "6.8.0-45-generic", {}, ExecutionDomain.POSIX),
        ("linux", "5.15.153.1-microsoft-standard-WSL2", {}, ExecutionDomain.WSL),
        ("linux", "4.4.0-19041-Microsoft", {}, ExecutionDomain.WSL),
        ("linux", "6.8.0", {"WSL_DISTRO_NAME": "Ubuntu"}, ExecutionDomain.WSL),
        ("linux", "6.8.0", {"WSL_INTEROP": "/run/WSL/1_interop"}, ExecutionDomain.WSL),
    ],
)
def test_the_execution_domain_is_recognised(
    platform_name: str, release: str, environ: dict[str, str], expected: ExecutionDomain
) -> None:
    found = detect_execution_domain(
        platform_name=platform_name, kernel_release=release, environ=environ
    )
    assert found is expected


def test_this_host_reports_its_psutil_ram_total() -> None:
    probe = probe_host()
    total = psutil.virtual_memory().total
    if probe.domain is ExecutionDomain.WSL:
        assert probe.pools[1].name == WSL_QUOTA
        assert probe.pools[1].total == total
    else:
        (pool,) = probe.pools
        assert pool.name == RAM_POOL
        assert pool.total == total
        assert pool.observed_by == "psutil"
    assert probe.cpu.kind is DeviceKind.CPU
    assert probe.cpu.execution_domain is probe.domain
    assert probe.logical_cpus == psutil.cpu_count(logical=True)
    data = probe.to_json()
    assert json.loads(json.dumps(data)) == data
    topology = probe.topology()
    assert topology.devices == (probe.cpu,)


def test_inside_wsl_the_vm_total_is_the_quota_and_host_ram_stays_unknown() -> None:
    ram, quota = observe_host_pools(ExecutionDomain.WSL, ram_total=16 * 1024**3)
    assert (ram.name, ram.total) == (RAM_POOL, None)
    assert (quota.name, quota.total, quota.within) == (WSL_QUOTA, 16 * 1024**3, RAM_POOL)
    cpu = host_cpu(ExecutionDomain.WSL)
    assert cpu.pools == (WSL_QUOTA,)


def test_on_windows_and_posix_hosts_machine_ram_is_observed_directly() -> None:
    for domain in (ExecutionDomain.WINDOWS, ExecutionDomain.POSIX):
        (ram,) = observe_host_pools(domain, ram_total=1024)
        assert (ram.name, ram.total, ram.within) == (RAM_POOL, 1024, None)


def test_observing_the_host_starts_no_process() -> None:
    """Counted in a fresh interpreter (``platform`` keeps its answers per process)."""
    script = (
        "import sys\n"
        "starts = []\n"
        "sys.addaudithook(lambda event, args: starts.append(event) if event in "
        "('subprocess.Popen', 'os.posix_spawn', 'os.fork', 'os.system') else None)\n"
        "from edge_core.pools import host_cpu, probe_host\n"
        "cpu = host_cpu()\n"
        "probe_host()\n"
        "print(cpu.name, len(starts))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, check=True)
    name, starts = done.stdout.split()
    assert starts == "0", done.stdout
    assert name  # a name all the same (the machine's, where no processor name is read)
