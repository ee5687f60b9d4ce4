"""What the command-line tests share: the text of their echo pipelines."""

from __future__ import annotations


def echo_pipeline(name: str, *, head: str = "", after: str = "") -> str:
    """A pipeline file's text: pipeline ``name``, one echo stage ``a`` of scale 2.0.

    ``head`` (lines, each ending in a newline) follows the name; ``after`` follows the
    stage's ``scale = 2.0`` line (more of its options, its route, more stages).
    """
    return (f'\nname = "{name}"\n{head}\n[[stages]]\nid = "a"\n[stages.backend]\n'
            f'name = "echo"\n[stages.backend.options]\nscale = 2.0\n{after}')
