"""The ``edge hub`` operations: devices, and compile → profile → inference of one bundle.

Each operation verifies the bundle locally, talks to AI Hub through a
:class:`~edge_qnn.hub.session.HubSession` and fills an evidence record
(:mod:`edge_qnn.hub.evidence`) as it goes, so a failure still leaves the job ids reached.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from edge_qnn.hub.evidence import delegation, label_for, new_record
from edge_qnn.hub.session import HubError, HubSession

__all__ = ["DEFAULT_COMPILE_OPTIONS", "STEPS", "list_devices", "run_bundle"]

#: What ``compile`` asks for unless ``--options`` says otherwise: a QNN context binary.
DEFAULT_COMPILE_OPTIONS = "--target_runtime qnn_context_binary"
#: The steps each command runs, in order.
STEPS = {"compile": ("compile",), "profile": ("compile", "profile"),
         "infer": ("compile", "profile", "infer")}


def _device_json(device: Any) -> dict[str, Any]:
    return {"name": device.name, "os": device.os, "attributes": list(device.attributes)}


def list_devices(session: HubSession, name: str = "") -> list[dict[str, Any]]:
    """The devices the service offers (``name``: an exact device name, or all)."""
    session.say("hub: listing devices")
    with session.calling("devices"):
        devices = session.client.get_devices(name=name)
    return [_device_json(d) for d in devices]


def _resolve_device(session: HubSession, name: str) -> Any:
    with session.calling("device"):
        found = session.client.get_devices(name=name)
    if not found:
        raise HubError("--device", "no such device on the service", name)
    return found[0]


def _local_reference(bundle: Any, inputs: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    expected = bundle.load_expected_outputs()
    if expected:
        return "expected-outputs", expected
    import onnxruntime as ort

    session = ort.InferenceSession(str(bundle.graph), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    values = session.run(names, dict(inputs))
    return "local-cpu-run", dict(zip(names, values, strict=True))


def run_bundle(session: HubSession, command: str, bundle_dir: Path, device_name: str,
               options: str, record: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run ``command``'s steps for the bundle; return the finished evidence record.

    ``record`` (when given) is filled in place, so the caller still has the job ids
    reached when a :class:`HubError` propagates.
    """
    from importlib.metadata import version

    from edge_core.artifacts import verify_bundle
    from edge_ort.numerics import compare_outputs

    with verify_bundle(bundle_dir, stage=True) as bundle:
        if bundle.references.external_data:
            raise HubError("bundle.external_data", "edge hub uploads single-file graphs only",
                           sorted(bundle.references.external_data))
        device = _resolve_device(session, device_name)
        filled = new_record(command, bundle.describe(), _device_json(device), session.api_url,
                            version("qai-hub"))
        if record is not None:
            record.update(filled)
            filled = record
        filled["compile_options"] = options
        steps = STEPS[command]
        session.say(f"hub: compiling {bundle.component} for {device.name}")
        with session.calling("compile"):
            compile_job = session.client.submit_compile_job(
                model=str(bundle.graph), device=device, name=bundle.component,
                options=options)
        filled["jobs"]["compile"] = compile_job.job_id
        session.wait(compile_job, "compile")
        with session.calling("compile.target_model", compile_job.job_id):
            target = compile_job.get_target_model()
        if target is None:
            raise HubError("hub.compile", "the job produced no target model", None,
                           compile_job.job_id)
        if "profile" in steps:
            inputs = bundle.load_example_inputs() if "infer" in steps else {}
            what = "infer" if inputs else "profile"
            session.say(f"hub: {'running' if inputs else 'profiling'} on {device.name}")
            with session.calling(what, compile_job.job_id):
                job = session.client.submit_inference_job(
                    model=target, device=device, name=bundle.component, profile=True,
                    inputs={k: [v] for k, v in inputs.items()} if inputs else None)
            filled["jobs"]["inference" if inputs else "profile"] = job.job_id
            session.wait(job, what)
            with session.calling(f"{what}.results", job.job_id):
                profile = job.download_profile()
                outputs = job.download_output_data() if inputs else None
            summary = profile.get("execution_summary", {})
            layers: list[Mapping[str, Any]] = [dict(layer) for layer in
                                               profile.get("execution_detail", [])]
            filled["layers"] = layers
            filled["delegation"] = delegation(layers)
            filled["estimated_inference_time_us"] = summary.get("estimated_inference_time")
            filled["peak_memory_bytes"] = summary.get("estimated_inference_peak_memory")
            if inputs:
                if not outputs:
                    raise HubError("hub.infer", "the job returned no output data", None,
                                   job.job_id)
                kind, reference = _local_reference(bundle, inputs)
                hosted = {name: values[0] for name, values in outputs.items()}
                validation = bundle.manifest.metadata.validation or {}
                comparison = compare_outputs(hosted, reference,
                                             dict(validation.get("bound") or {}), kind)
                filled["execution"] = {"evidence": "outputs-compared",
                                       "comparison": comparison}
        comparison = filled["execution"]["comparison"]
        if comparison is not None and not comparison.get("passed"):
            filled["status"] = "failed"
            filled["error"] = ("outputs differ from the local reference beyond the bound: "
                               f"max_abs_error={comparison.get('max_abs_error')}")
        else:
            filled["status"] = "passed"
        filled["label"] = label_for(filled)
        return filled
