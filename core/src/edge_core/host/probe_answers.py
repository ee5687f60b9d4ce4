"""Probe answers kept per boot and per installed stack, so a fresh ``edge`` need not ask again.

Two kinds of answer are kept in ``$EDGE_PROBE_CACHE`` (default
``$XDG_CACHE_HOME/edge/probes``; ``off`` keeps nothing), each file written atomically,
mode 0600, in a folder of mode 0700. A file that cannot be read or does not verify is
asked again, never an error; every answer says when it was kept.

**A probe command's answer** (:func:`cached_probe`). Some probes start an interpreter that
imports a runtime to list its devices (the QNN probe imports ONNX Runtime and registers the
QNN library): that costs more than the whole ``edge probe`` should. Such a probe runs as
:func:`~edge_core.host.probe_process.run_probe` runs it, and a successful answer (exit
status 0, some output) is kept under a key of everything it depends on:

* the command (the interpreter's path and the probe's script) and the environment the
  probe starts with (the allowlist plus what it declares: ``ADSP_LIBRARY_PATH``, say);
* the interpreter's installed stack: each of its ``site-packages`` folders (and, for the
  controller's own interpreter, its user ``site-packages`` and ``PYTHONPATH`` folders)
  with its modification time (installing, upgrading or removing a distribution changes
  it) — an interpreter whose ``site-packages`` cannot be found is never cached;
* the machine's boot time (a driver or device change needs a restart to be seen) and
  edge-core's version.

**The whole answer of** ``edge probe`` (:func:`kept_answer`, :func:`keep_answer`): every
backend's report, the plugin errors (none: only an answer without any is kept) and the
host, kept so that a fresh ``edge probe`` imports no plugin, no runtime and none of the
plugin machinery while nothing it depends on has moved. Its key (:func:`stack_key`):

* edge-core's version, this interpreter (path and version) and its ``sys.path``, each
  folder with its modification time (an install, upgrade or removal in any of them, a new
  ``.pth`` entry, another working directory on the path);
* this process's whole environment but the shell's bookkeeping (:data:`VOLATILE_ENV`),
  as a BLAKE2 digest: no value is written to disk;
* the boot time, the logical CPU count and the physical memory total, the user and its
  groups (device access is granted per group).

``edge plugins``' plain listing (no ``--backends``) is kept the same way, when no plugin
failed to load: a fresh listing then imports no plugin module.

With the answer are kept, and checked before it is reused, the identity (path,
modification time, size) of every module file loaded when it was made — the plugins'
code, edge-core's, the runtimes' — and the ``site-packages`` folders of every other
interpreter its probes asked (:func:`~edge_core.host.probe_process.observed_probes`).
Anything else a probe reads (a device node, a vendor SDK's folder) is seen again after a
reboot, or at once with ``edge probe --fresh`` or ``EDGE_PROBE_CACHE=off``.

Reading a kept answer imports nothing beyond :mod:`json` and the standard library's
BLAKE2 on Linux (elsewhere psutil reads the boot time): a process that only reads it stays
as light as ``edge`` itself.
"""

from __future__ import annotations

import json
import os
import sys
import time

from edge_core import __version__

TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess
    from collections.abc import Iterable, Mapping, Sequence
    from pathlib import Path
    from typing import Any

try:  # hashlib's blake2b itself; importing hashlib loads OpenSSL (several ms) first
    from _blake2 import blake2b
except ImportError:  # pragma: no cover - an interpreter built without it
    from hashlib import blake2b

__all__ = ["KINDS", "PROBE_CACHE_ENV", "VOLATILE_ENV", "cached_probe", "keep_answer", "kept_answer",
           "probe_cache_dir", "site_folders", "stack_key"]

PROBE_CACHE_ENV = "EDGE_PROBE_CACHE"
"""A directory for cached probe answers, or ``off``."""

VOLATILE_ENV = ("_", "OLDPWD", "PWD", "SHLVL")
"""What a shell changes between two commands without changing what a probe can see: left
out of the whole answer's key (every other variable is in it)."""

_FORMAT = "edge-probe-answer/1"
_WHOLE_FORMAT = "edge-probe-whole/1"
_WHOLE_KEPT = 32
"""Whole answers of each kind kept at most (the oldest beyond go when one is kept)."""
KINDS = ("probe", "plugins")
"""What is kept whole: ``edge probe``'s answer, and ``edge plugins``' plain listing."""


def probe_cache_dir(env: Mapping[str, str] | None = None) -> Path | None:
    """``$EDGE_PROBE_CACHE`` (``None`` when ``off``), else ``$XDG_CACHE_HOME/edge/probes``."""
    from pathlib import Path

    env = os.environ if env is None else env
    configured = env.get(PROBE_CACHE_ENV)
    if configured:
        return None if configured.lower() == "off" else Path(configured)
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "edge" / "probes"


def _cache_folder(env: Mapping[str, str] | None = None) -> str | None:
    """:func:`probe_cache_dir` as a string, found without :mod:`pathlib`."""
    env = os.environ if env is None else env
    configured = env.get(PROBE_CACHE_ENV)
    if configured:
        return None if configured.lower() == "off" else configured
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "edge", "probes")


def site_folders(interpreter: str) -> list[Path]:
    """The ``site-packages`` folders of ``interpreter``, found without running it.

    For this process's own interpreter also its user ``site-packages`` and the
    ``PYTHONPATH`` folders, when they exist (a probe it starts sees them too).
    """
    from pathlib import Path

    if os.path.abspath(interpreter) == os.path.abspath(sys.executable):
        import site
        import sysconfig

        paths = sysconfig.get_paths()
        found = [Path(paths["purelib"]), Path(paths["platlib"])]
        if found[0].is_dir() or found[1].is_dir():
            if site.ENABLE_USER_SITE:
                found.append(Path(site.getusersitepackages()))
            found += [Path(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    else:
        root = Path(interpreter).parent.parent  # .../bin/python -> the environment
        found = [*root.glob("lib/python3*/site-packages"), root / "Lib" / "site-packages"]
    return sorted({p for p in found if p.is_dir()})


def _boot_time() -> float | None:
    """The machine's boot time (``/proc/stat`` on Linux, else psutil), or ``None``."""
    try:
        with open("/proc/stat", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil

        return float(psutil.boot_time())
    except Exception:  # no boot time: nothing is cached
        return None


def _memory_total() -> int | None:
    """Physical memory in bytes, as psutil reads it (``MemTotal``), without psutil on Linux."""
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil

        return int(psutil.virtual_memory().total)
    except Exception:
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
    return blake2b(json.dumps(material, sort_keys=True).encode(), digest_size=32).hexdigest()


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def cached_probe(argv: Sequence[str], *, interpreter: str, timeout_s: float,
                 declared: Iterable[str] = (),
                 ) -> tuple[subprocess.CompletedProcess[str], str | None]:
    """Run a probe, or give its cached answer; the answer, and when it was cached.

    The second value is ``None`` when the probe ran now. Raises as
    :func:`~edge_core.host.probe_process.run_probe` does.
    """
    import subprocess

    from edge_core.host.probe_process import note_probe, probe_environment, run_probe

    declared = tuple(declared)
    directory = _cache_folder()
    key = None
    if directory is not None:
        key = _key(argv, probe_environment(declared=declared), interpreter)
    path = os.path.join(directory, f"{key}.json") if directory and key else None
    if path is not None:
        document = _read(path)
        if (document is not None and document.get("format") == _FORMAT
                and document.get("key") == key and isinstance(document.get("stdout"), str)
                and isinstance(document.get("cached_at"), str)):
            note_probe(argv)
            return (subprocess.CompletedProcess(list(argv), 0, document["stdout"], ""),
                    document["cached_at"])
    result = run_probe(argv, timeout_s=timeout_s, declared=declared)
    if path is not None and result.returncode == 0 and result.stdout.strip():
        _store(path, {"format": _FORMAT, "key": key, "stdout": result.stdout,
                      "cached_at": _now()})
    return result, None


# -- the whole answer of ``edge probe`` -------------------------------------------------


def _mtime(path: str) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def _env_digest(env: Mapping[str, str]) -> str:
    text = "\0".join(f"{name}={value}" for name, value in sorted(env.items())
                     if name not in VOLATILE_ENV)
    return blake2b(text.encode("utf-8", "surrogateescape"), digest_size=32).hexdigest()


def stack_key(env: Mapping[str, str] | None = None) -> str | None:
    """The key of ``edge probe``'s whole answer here and now (see the module docstring).

    ``None`` when the boot time cannot be read: then nothing is kept or reused.
    """
    boot = _boot_time()
    if boot is None:
        return None
    entries = [os.path.abspath(entry or ".") for entry in sys.path]
    user = [os.getuid(), sorted(os.getgroups())] if hasattr(os, "getuid") else None
    material = {
        "format": _WHOLE_FORMAT, "edge_core": __version__, "executable": sys.executable,
        "version": sys.version, "path": [[entry, _mtime(entry)] for entry in entries],
        "env": _env_digest(os.environ if env is None else env), "boot": boot,
        "cpus": os.cpu_count(), "memory": _memory_total(), "user": user,
    }
    return blake2b(json.dumps(material).encode("utf-8", "surrogateescape"),
                   digest_size=32).hexdigest()


def _whole_path(directory: str, key: str, kind: str) -> str:
    if kind not in KINDS:
        raise ValueError(f"kind: not one of {list(KINDS)}: {kind!r}")
    return os.path.join(directory, f"edge-{kind}-{key}.json")


def _file_stamp(path: str) -> list[object] | None:
    try:
        status = os.stat(path)
    except OSError:
        return None
    return [path, status.st_mtime_ns, status.st_size]


def _interpreter_stamp(program: str) -> list[object]:
    folders = [[str(f), _mtime(str(f))] for f in site_folders(program)]
    return [program, _file_stamp(os.path.realpath(program)), folders]


def _still(document: Mapping[str, Any]) -> bool:
    """True when every module file and probed interpreter is as it was when kept."""
    files = document.get("files")
    programs = document.get("interpreters")
    if not isinstance(files, list) or not isinstance(programs, list):
        return False
    for stamp in files:
        if not isinstance(stamp, list) or len(stamp) != 3 or _file_stamp(str(stamp[0])) != stamp:
            return False
    return all(isinstance(kept, list) and len(kept) == 3
               and _interpreter_stamp(str(kept[0])) == kept for kept in programs)


def kept_answer(env: Mapping[str, str] | None = None, kind: str = "probe"
                ) -> tuple[dict[str, Any], str] | None:
    """The kept whole answer of ``edge probe`` and when it was kept, if it still holds.

    ``kind="plugins"``: ``edge plugins``' kept listing instead (:data:`KINDS`).

    ``None`` when keeping is off, nothing is kept under this :func:`stack_key`, the file
    does not verify, or a module file or probed interpreter it depends on has changed.
    """
    directory = _cache_folder(env)
    key = stack_key(env) if directory is not None else None
    if directory is None or key is None:
        return None
    document = _read(_whole_path(directory, key, kind))
    if (document is None or document.get("format") != _WHOLE_FORMAT
            or document.get("key") != key or not isinstance(document.get("answer"), dict)
            or not isinstance(document.get("cached_at"), str) or not _still(document)):
        return None
    return document["answer"], document["cached_at"]


def keep_answer(answer: Mapping[str, Any], programs: Iterable[str] = (),
                env: Mapping[str, str] | None = None, kind: str = "probe") -> bool:
    """Keep ``edge probe``'s whole answer under this :func:`stack_key`; True when kept.

    ``kind="plugins"``: ``edge plugins``' listing instead (:data:`KINDS`).

    ``programs``: what its probes asked (:func:`~edge_core.host.probe_process
    .observed_probes`); this interpreter's own is covered by the key. Every module file
    loaded now is stamped: call this right after probing, in the process that probed.
    """
    directory = _cache_folder(env)
    key = stack_key(env) if directory is not None else None
    if directory is None or key is None:
        return False
    files = set()
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and os.path.isabs(path):
            files.add(path)
    stamps = [stamp for stamp in map(_file_stamp, sorted(files)) if stamp is not None]
    own = os.path.abspath(sys.executable)
    others = sorted({p for p in programs if os.path.abspath(p) != own})
    document = {"format": _WHOLE_FORMAT, "key": key, "cached_at": _now(),
                "answer": json.loads(json.dumps(answer, default=str)), "files": stamps,
                "interpreters": [_interpreter_stamp(p) for p in others]}
    path = _whole_path(directory, key, kind)
    _store(path, document)
    _prune(directory, f"edge-{kind}-")
    return os.path.exists(path)


def _prune(directory: str, prefix: str) -> None:
    """Remove the oldest whole answers beyond :data:`_WHOLE_KEPT` (other boots, stacks)."""
    try:
        names = [n for n in os.listdir(directory)
                 if n.startswith(prefix) and n.endswith(".json")]
        if len(names) <= _WHOLE_KEPT:
            return
        paths = sorted((os.path.join(directory, n) for n in names), key=os.path.getmtime)
        for path in paths[:-_WHOLE_KEPT]:
            os.unlink(path)
    except OSError:
        return


# -- files -----------------------------------------------------------------------------


def _read(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as handle:
            document = json.load(handle)
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return document if isinstance(document, dict) else None


def _store(path: str, document: Mapping[str, object]) -> None:
    """Write atomically, mode 0600; a cache that cannot be written is left alone."""
    import contextlib
    import tempfile

    with contextlib.suppress(OSError):
        folder = os.path.dirname(path)
        os.makedirs(folder, mode=0o700, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=folder, prefix=".probe.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(document, handle)
            os.replace(temporary, path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
