"""``edge run`` starts the processes its stages need and no other: counted, never timed.

An audit hook in the ``edge`` process records every process it starts (``subprocess``,
``posix_spawn``, ``fork``, ``system``) while it runs a two-stage echo pipeline: one
supervisor per stage (each starts its worker itself) — or, with the warm pool, one zygote
that forks them — nothing else — no helper command on
the way to the first answer (``platform.processor()`` ran ``uname -p`` while the ledger
was made, once per ``edge run``, for a CPU name the ledger does not use). Nor does it
import what it never uses: ``asyncio`` (and ``ssl`` with it) only serves the async API.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edge_core.host.bootstrap import SUPERVISED
from edge_core.host.warm_pool import POOL_ENV

from .conftest import echo_pipeline

HOOKED_EDGE = """\
import json, sys
starts = []
def hook(event, args):
    if event == "subprocess.Popen":
        starts.append([event, [str(a) for a in args[1]]])
    elif event in ("os.posix_spawn", "os.fork", "os.forkpty", "os.system", "os.exec"):
        starts.append([event, []])
sys.addaudithook(hook)
from edge_core.cli import main
try:
    status = main(sys.argv[1:])
finally:
    sys.stderr.write("STARTS " + json.dumps(starts) + "\\n")
    sys.stderr.write("MODULES " + json.dumps(sorted(sys.modules)) + "\\n")
sys.exit(status)
"""

PIPELINE = echo_pipeline("two", after="""
[[stages]]
id = "b"
input_transform = "edge_echo.transforms:passthrough"
[stages.backend]
name = "echo"
[stages.backend.options]
scale = 3.0
""")


@pytest.mark.parametrize("pool", ["1", "0"], ids=["warm-pool", "pool-off"])
def test_edge_run_starts_one_supervisor_per_stage_and_imports_no_asyncio(
        tmp_path: Path, pool: str) -> None:
    (tmp_path / "pipeline.toml").write_text(PIPELINE)
    np.savez(tmp_path / "in.npz", x=np.array([1.0, 2.0], np.float32))
    env = {**os.environ, "EDGE_PLUGINS": "echo",
           "EDGE_PLACEMENT_CACHE": str(tmp_path / "cache"), POOL_ENV: pool}
    done = subprocess.run([sys.executable, "-c", HOOKED_EDGE, "run", "pipeline.toml",
                           "--inputs", "in.npz", "--json"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["ok"] is True
    line = next(x for x in done.stderr.splitlines() if x.startswith("STARTS "))
    starts = json.loads(line.removeprefix("STARTS "))
    line = next(x for x in done.stderr.splitlines() if x.startswith("MODULES "))
    modules = set(json.loads(line.removeprefix("MODULES ")))
    assert "edge_core.runtime.pipeline" in modules  # the hook saw the whole run
    assert not modules & {"asyncio", "ssl"}, sorted(modules & {"asyncio", "ssl"})
    pooled = pool == "1" and SUPERVISED and sys.platform.startswith("linux")
    if pooled:  # one zygote, which forks a supervisor per stage (each forks its worker)
        assert len(starts) == 1, starts
        ((event, argv),) = starts
        assert event == "subprocess.Popen" and "edge_core.host.zygote" in argv[2], starts
        return
    assert len(starts) == 2, starts  # stages a and b, one start each
    for event, argv in starts:
        assert event == "subprocess.Popen", starts
        if SUPERVISED:
            assert any(arg.endswith("supervisor.py") for arg in argv), argv
