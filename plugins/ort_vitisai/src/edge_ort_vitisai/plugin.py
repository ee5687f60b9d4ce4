"""The `ort-vitisai` backend's controller-side hook implementations.

Only declaration and probe exist so far; the probe says plainly that the backend is not
implemented, so no stage can be admitted on it.
"""

from __future__ import annotations

from edge_core import hookimpl
from edge_ort_vitisai import __version__

TYPE_CHECKING = False
if TYPE_CHECKING:
    from edge_core.backend import BackendInfo, ProbeReport

#: The hook-contract version this plugin was written against.
EDGE_CONTRACT = "1.0"


def backend_info() -> BackendInfo:
    """This plugin's backend declaration (built on demand: importing the plugin stays cheap)."""
    from edge_core.backend import BackendInfo

    return BackendInfo(
        name="ort-vitisai",
        kinds=("graph",),
        preemptible=False,
        max_concurrency=1,
        providers=('VitisAIExecutionProvider',),
        description="ONNX Runtime VitisAI on the AMD Ryzen AI NPU (Windows only).",
    )


@hookimpl
def edge_backends() -> list[BackendInfo]:
    """Declare the `ort-vitisai` backend."""
    return [backend_info()]


@hookimpl
def edge_probe() -> list[ProbeReport]:
    """Report the backend as unavailable: it is not implemented in this release."""
    from edge_core.backend import ProbeReport

    return [
        ProbeReport(
            backend=backend_info().name,
            available=False,
            reason=f"not implemented in edge-ort-vitisai {__version__}: only the declaration and "
            "probe exist so far",
        )
    ]
