"""A stage without a route may run on the vendor interpreter the backend's variable names.

So the backend declares no key for a warm pool's zygote started ahead
(``BackendInfo.worker_preload`` None): ``Pipeline.open`` starts none for it.
"""

from __future__ import annotations

from edge_ort_directml.plugin import PLUGIN


def test_the_backend_declares_no_key_for_a_zygote_started_ahead() -> None:
    (info,) = PLUGIN.edge_backends()
    assert info.worker_preload is None, info
