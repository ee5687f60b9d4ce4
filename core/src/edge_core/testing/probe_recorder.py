"""Tests of probe isolation: a command that records how it was started, then runs the real one.

:func:`recording_command` writes a POSIX shell script that saves the environment it
received and what its standard input is, then execs the real command with the same
arguments. Given to a probe as its interpreter (``EDGE_QNN_PYTHON``, a vendor backend's
interpreter) or as its ``nvidia-smi``, it shows what that probe's process really got,
while the probe still runs for real. POSIX only (the script needs ``/bin/sh`` and
``/proc/self/fd/0``).
"""

from __future__ import annotations

import shlex
from pathlib import Path

import attrs

__all__ = ["Recording", "recording_command"]


@attrs.frozen
class Recording:
    """A recording command and where it writes what it saw."""

    command: Path
    """The script to start in place of the real command."""
    environ_file: Path
    """Its environment, one ``NAME=value`` per line (``env``'s output)."""
    stdin_file: Path
    """What its standard input was (``readlink /proc/self/fd/0``)."""

    def environ(self) -> dict[str, str]:
        """The recorded environment (of the last run), by name."""
        lines = self.environ_file.read_text().splitlines()
        return dict(line.split("=", 1) for line in lines if "=" in line)

    def stdin(self) -> str:
        """The recorded standard input (of the last run), e.g. ``/dev/null``."""
        return self.stdin_file.read_text().strip()


def recording_command(folder: Path, target: str | Path, name: str = "recording") -> Recording:
    """Write a script in ``folder`` that records its start, then execs ``target``."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / name
    environ_file = folder / f"{name}.environ"
    stdin_file = folder / f"{name}.stdin"
    script.write_text(
        "#!/bin/sh\n"
        f"env > {shlex.quote(str(environ_file))}\n"
        f"readlink /proc/self/fd/0 > {shlex.quote(str(stdin_file))}\n"
        f'exec {shlex.quote(str(target))} "$@"\n'
    )
    script.chmod(0o755)
    return Recording(script, environ_file, stdin_file)
