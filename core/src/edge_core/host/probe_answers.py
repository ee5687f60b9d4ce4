"""Probe answers kept per boot and per installed stack, so a fresh ``edge`` need not ask again.

Some probes start an interpreter that imports a runtime to list its devices (the QNN
probe imports ONNX Runtime and registers the QNN library): that costs more than the
whole ``edge probe`` should. :func:`cached_probe` runs such a probe as
:func:`~edge_core.host.probe_process.run_probe` does and keeps a successful answer (exit
status 0, some output) in ``$EDGE_PROBE_CACHE`` (default ``$XDG_CACHE_HOME/edge/probes``;
``off`` keeps nothing), under a key made of everything the answer depends on:

* the command (the interpreter's path and the probe's script) and the environment the
  probe starts with (the allowlist plus what it declares: ``ADSP_LIBRARY_PATH``, say);
* the interpreter's installed stack: each of its ``site-packages`` folders with its
  modification time (installing, upgrading or removing a distribution changes it) — an
  interpreter whose ``site-packages`` cannot be found is never cached;
* the machine's boot time (a driver or device change needs a restart to be seen) and
  edge-core's version.

Anything else asks again. A file that cannot be read or does not verify is asked again
too, never an error. The answer says when it was cached, and the probe's report says so.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from edge_core import __version__
from edge_core.host.probe_process import probe_environment, run_probe

__all__ = ["PROBE_CACHE_ENV", "cached_probe", "probe_cache_dir", "site_folders"]

PROBE_CACHE_ENV = "EDGE_PROBE_CACHE"
"""A directory for cached probe answers, or ``off``."""

_FORMAT = "edge-probe-answer/1"


def probe_cache_dir(env: Mapping[str, str] | None = None) -> Path | None:
    """``$EDGE_PROBE_CACHE`` (``None`` when ``off``), else ``$XDG_CACHE_HOME/edge/probes``."""
    env = os.environ if env is None else env
    configured = env.get(PROBE_CACHE_ENV)
    if configured:
        return None if configured.lower() == "off" else Path(configured)
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "edge" / "probes"


def site_folders(interpreter: str) -> list[Path]:
    """The ``site-packages`` folders of ``interpreter``, found without running it."""
    if os.path.abspath(interpreter) == os.path.abspath(sys.executable):
        found = [Path(p) for p in {sysconfig.get_paths()["purelib"],
                                   sysconfig.get_paths()["platlib"]}]
    else:
        root = Path(interpreter).parent.parent  # .../bin/python -> the environment
        found = [*root.glob("lib/python3*/site-packages"), root / "Lib" / "site-packages"]
    return sorted(p for p in found if p.is_dir())


def _boot_time() -> float | None:
    try:
        import psutil

        return float(psutil.boot_time())
    except Exception:  # no boot time: nothing is cached
        return None


def _key(argv: Sequence[str], env: Mapping[str, str], interpreter: str) -> str | None:
    folders = site_folders(interpreter)
    boot = _boot_time()
    if not folders or boot is None:
        return None
    try:
        stamps = {str(f): f.stat().st_mtime_ns for f in folders}
    except OSError:
        return None
    material = {"argv": list(argv), "env": dict(sorted(env.items())), "site": stamps,
                "boot": boot, "edge_core": __version__}
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def cached_probe(argv: Sequence[str], *, interpreter: str, timeout_s: float,
                 declared: Iterable[str] = (),
                 ) -> tuple[subprocess.CompletedProcess[str], str | None]:
    """Run a probe, or give its cached answer; the answer, and when it was cached.

    The second value is ``None`` when the probe ran now. Raises as
    :func:`~edge_core.host.probe_process.run_probe` does.
    """
    declared = tuple(declared)
    directory = probe_cache_dir()
    key = None
    if directory is not None:
        key = _key(argv, probe_environment(declared=declared), interpreter)
    path = directory / f"{key}.json" if directory is not None and key is not None else None
    if path is not None:
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
            if (isinstance(document, dict) and document.get("format") == _FORMAT
                    and document.get("key") == key and isinstance(document.get("stdout"), str)
                    and isinstance(document.get("cached_at"), str)):
                return (subprocess.CompletedProcess(list(argv), 0, document["stdout"], ""),
                        document["cached_at"])
        except (OSError, ValueError, UnicodeDecodeError):
            pass
    result = run_probe(argv, timeout_s=timeout_s, declared=declared)
    if path is not None and result.returncode == 0 and result.stdout.strip():
        _store(path, {"format": _FORMAT, "key": key, "stdout": result.stdout,
                      "cached_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
                      .replace("+00:00", "Z")})
    return result, None


def _store(path: Path, document: Mapping[str, object]) -> None:
    """Write atomically, mode 0600; a cache that cannot be written is left alone."""
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".probe.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(document, handle)
            os.replace(temporary, path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
