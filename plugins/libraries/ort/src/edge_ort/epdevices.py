"""What ONNX Runtime in a given interpreter lists: providers and ``get_ep_devices()``.

The controller never imports ``onnxruntime``; :func:`query_ep_devices` runs
:data:`EP_DEVICES_SCRIPT` in the route's interpreter (``python -I -c``, no shell) and parses
the one JSON line it prints. The script needs only the standard library and whichever
``onnxruntime`` distribution that interpreter has, so it runs in a vendor environment with
nothing of edge installed. Before listing, it may register execution-provider libraries
that ship inside that ``onnxruntime`` package (VitisAI's, say), because ORT lists the
devices of such a provider only once its library is registered.

Provider and device names are exactly what ORT printed; nothing here spells them.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from edge_core.errors import EdgeError
from edge_core.host.probe_process import run_probe

__all__ = [
    "EP_DEVICES_SCRIPT",
    "EpDevice",
    "EpDevices",
    "EpDevicesInvalid",
    "EpLibrary",
    "LibraryRegistration",
    "parse_ep_devices",
    "query_ep_devices",
]


class EpDevicesInvalid(EdgeError, ValueError):
    """The device listing printed by the probe script is malformed."""

    def __init__(self, field: str, reason: str, value: object) -> None:
        self.field = field
        self.reason = reason
        self.value = value
        super().__init__(f"{field}: {reason}: {value!r}")


#: Runs in the route's interpreter: ``argv[1]`` is ``{"libraries": [{"name", "stem"}]}``.
EP_DEVICES_SCRIPT = r"""
import json, os, sys
request = json.loads(sys.argv[1])
out = {"python": sys.executable, "onnxruntime": None, "available_providers": [],
       "ep_devices": None, "libraries": [], "error": None}
try:
    import onnxruntime as ort
except Exception as exc:
    out["error"] = "import onnxruntime: %s: %s" % (type(exc).__name__, exc)
    print("\n" + json.dumps(out))
    sys.exit(0)
out["onnxruntime"] = str(ort.__version__)
capi = os.path.join(os.path.dirname(os.path.abspath(ort.__file__)), "capi")
for lib in request.get("libraries", []):
    stem = lib["stem"]
    found = [os.path.join(capi, n) for n in (stem + ".dll", "lib" + stem + ".so",
                                             "lib" + stem + ".dylib")]
    found = [p for p in found if os.path.isfile(p)]
    entry = {"name": lib["name"], "path": found[0] if found else None,
             "registered": False, "error": None}
    if not found:
        entry["error"] = "no %s library in %s" % (stem, capi)
    else:
        try:
            ort.register_execution_provider_library(lib["name"], found[0])
            entry["registered"] = True
        except Exception as exc:
            entry["error"] = "%s: %s" % (type(exc).__name__, exc)
    out["libraries"].append(entry)
out["available_providers"] = [str(p) for p in ort.get_available_providers()]
get_ep_devices = getattr(ort, "get_ep_devices", None)
if get_ep_devices is not None:
    text = lambda pairs: {str(k): str(v) for k, v in dict(pairs).items()}
    devices = []
    for d in get_ep_devices():
        hw = d.device
        devices.append({
            "ep_name": str(d.ep_name), "ep_vendor": str(d.ep_vendor),
            "ep_metadata": text(d.ep_metadata), "ep_options": text(d.ep_options),
            "device": {"type": getattr(hw.type, "name", str(hw.type)), "vendor": str(hw.vendor),
                       "vendor_id": int(hw.vendor_id), "device_id": int(hw.device_id),
                       "metadata": text(hw.metadata)},
        })
    out["ep_devices"] = devices
print("\n" + json.dumps(out))
"""


@attrs.frozen
class EpLibrary:
    """An execution-provider library shipped inside the interpreter's ``onnxruntime``.

    Attributes:
        name: The registration name (the provider name, as ORT spells it).
        stem: The file name without platform prefix or suffix
            (``onnxruntime_providers_vitisai`` → ``.dll`` / ``lib….so``).
    """

    name: str
    stem: str


@attrs.frozen
class LibraryRegistration:
    """What became of one :class:`EpLibrary` in the probe script."""

    name: str
    path: str | None
    registered: bool
    error: str | None


@attrs.frozen
class EpDevice:
    """One ``OrtEpDevice``: an execution provider paired with a hardware device.

    Attributes:
        ep_name: The provider name as ORT reports it.
        ep_vendor: The provider's vendor.
        ep_metadata: The provider's metadata for this device.
        ep_options: Provider options ORT pre-sets for this device (DirectML: ``device_id``).
        device_type: ``CPU``, ``GPU`` or ``NPU`` (``OrtHardwareDeviceType`` names).
        vendor: The hardware vendor's name.
        vendor_id: PCI vendor id.
        device_id: PCI device id.
        metadata: The hardware device's metadata (on Windows: ``LUID``, ``Description``,
            ``DxgiAdapterNumber``, ``DxgiVideoMemory``, ``Discrete`` ...).
    """

    ep_name: str
    ep_vendor: str
    ep_metadata: Mapping[str, str]
    ep_options: Mapping[str, str]
    device_type: str
    vendor: str
    vendor_id: int
    device_id: int
    metadata: Mapping[str, str]

    def label(self) -> str:
        """``ep_name/type`` plus the description when there is one, for messages."""
        description = self.metadata.get("Description")
        return f"{self.ep_name}/{self.device_type}" + (f" ({description})" if description else "")


@attrs.frozen
class EpDevices:
    """Everything the probe script saw in one interpreter.

    Attributes:
        interpreter: The interpreter that was asked.
        onnxruntime: Its ``onnxruntime.__version__`` (``None`` when the import failed).
        available_providers: ``get_available_providers()``, verbatim.
        devices: ``get_ep_devices()``; ``None`` when this build has no such function.
        libraries: What became of each library the script was asked to register.
        error: Why nothing could be listed (import failure, crash, timeout).
    """

    interpreter: str
    onnxruntime: str | None
    available_providers: tuple[str, ...]
    devices: tuple[EpDevice, ...] | None
    libraries: tuple[LibraryRegistration, ...] = ()
    error: str | None = None

    def for_provider(self, provider: str, device_type: str | None = None) -> tuple[EpDevice, ...]:
        """The devices ORT lists for ``provider`` (optionally of one hardware type)."""
        return tuple(d for d in self.devices or ()
                     if d.ep_name == provider
                     and (device_type is None or d.device_type == device_type))


def _text_map(value: object, field: str) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise EpDevicesInvalid(field, "must be a mapping of strings", value)
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise EpDevicesInvalid(field, "every key and value must be a string", value)
    return dict(value)


def _text(value: object, field: str, optional: bool = False) -> Any:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise EpDevicesInvalid(field, "must be a string", value)
    return value


def _int(value: object, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**32:
        raise EpDevicesInvalid(field, "must be an integer in [0, 2**32)", value)
    return value


def _device(item: object, field: str) -> EpDevice:
    if not isinstance(item, Mapping):
        raise EpDevicesInvalid(field, "must be a mapping", item)
    hw = item.get("device")
    if not isinstance(hw, Mapping):
        raise EpDevicesInvalid(f"{field}.device", "must be a mapping", hw)
    device_type = _text(hw.get("type"), f"{field}.device.type")
    if device_type not in ("CPU", "GPU", "NPU"):
        raise EpDevicesInvalid(f"{field}.device.type", "must be CPU, GPU or NPU", device_type)
    return EpDevice(
        ep_name=_text(item.get("ep_name"), f"{field}.ep_name"),
        ep_vendor=_text(item.get("ep_vendor"), f"{field}.ep_vendor"),
        ep_metadata=_text_map(item.get("ep_metadata", {}), f"{field}.ep_metadata"),
        ep_options=_text_map(item.get("ep_options", {}), f"{field}.ep_options"),
        device_type=device_type,
        vendor=_text(hw.get("vendor"), f"{field}.device.vendor"),
        vendor_id=_int(hw.get("vendor_id"), f"{field}.device.vendor_id"),
        device_id=_int(hw.get("device_id"), f"{field}.device.device_id"),
        metadata=_text_map(hw.get("metadata", {}), f"{field}.device.metadata"),
    )


def _registration(item: object, field: str) -> LibraryRegistration:
    if not isinstance(item, Mapping):
        raise EpDevicesInvalid(field, "must be a mapping", item)
    registered = item.get("registered")
    if not isinstance(registered, bool):
        raise EpDevicesInvalid(f"{field}.registered", "must be true or false", registered)
    return LibraryRegistration(
        name=_text(item.get("name"), f"{field}.name"),
        path=_text(item.get("path"), f"{field}.path", optional=True),
        registered=registered,
        error=_text(item.get("error"), f"{field}.error", optional=True),
    )


def parse_ep_devices(data: object, interpreter: str) -> EpDevices:
    """Check and structure the probe script's JSON (a real or a recorded listing).

    Raises:
        EpDevicesInvalid: naming the first malformed field.
    """
    if not isinstance(data, Mapping):
        raise EpDevicesInvalid("ep_devices", "must be a JSON object", data)
    providers = data.get("available_providers", [])
    if not isinstance(providers, list) or not all(isinstance(p, str) for p in providers):
        raise EpDevicesInvalid("available_providers", "must be a list of strings", providers)
    raw_devices = data.get("ep_devices")
    devices: tuple[EpDevice, ...] | None = None
    if raw_devices is not None:
        if not isinstance(raw_devices, list):
            raise EpDevicesInvalid("ep_devices", "must be a list or null", raw_devices)
        devices = tuple(_device(d, f"ep_devices[{i}]") for i, d in enumerate(raw_devices))
    libraries = data.get("libraries", [])
    if not isinstance(libraries, list):
        raise EpDevicesInvalid("libraries", "must be a list", libraries)
    return EpDevices(
        interpreter=interpreter,
        onnxruntime=_text(data.get("onnxruntime"), "onnxruntime", optional=True),
        available_providers=tuple(providers),
        devices=devices,
        libraries=tuple(_registration(r, f"libraries[{i}]") for i, r in enumerate(libraries)),
        error=_text(data.get("error"), "error", optional=True),
    )


def _failed(interpreter: str, error: str) -> EpDevices:
    return EpDevices(interpreter=interpreter, onnxruntime=None, available_providers=(),
                     devices=None, error=error)


def query_ep_devices(interpreter: str, libraries: Sequence[EpLibrary] = (),
                     timeout_s: float = 30.0, *, env_names: Sequence[str] = ()) -> EpDevices:
    """Run :data:`EP_DEVICES_SCRIPT` in ``interpreter`` and parse what it printed.

    The interpreter runs isolated (``-I``: no working directory or user site on
    ``sys.path``, no ``PYTHON*`` variable read) as a probe
    (:func:`edge_core.host.probe_process.run_probe`): the allowlisted environment plus
    ``env_names``, stdin closed, ``timeout_s`` bounding it.

    Never raises for a broken interpreter: a crash, a timeout or unreadable output comes
    back as :attr:`EpDevices.error`, which a probe turns into its reason.
    """
    request = json.dumps({"libraries": [{"name": lib.name, "stem": lib.stem}
                                        for lib in libraries]})
    try:
        done = run_probe([interpreter, "-I", "-c", EP_DEVICES_SCRIPT, request],
                         timeout_s=timeout_s, declared=env_names)
    except subprocess.TimeoutExpired:
        return _failed(interpreter, f"listing devices took longer than {timeout_s} s")
    except OSError as exc:
        return _failed(interpreter, f"cannot run the interpreter: {type(exc).__name__}: {exc}")
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    if done.returncode != 0 or not lines:
        detail = (done.stderr or done.stdout).strip()[-300:]
        return _failed(interpreter, f"the device listing exited {done.returncode}: {detail!r}")
    try:
        data = json.loads(lines[-1])
        return parse_ep_devices(data, interpreter)
    except (json.JSONDecodeError, EpDevicesInvalid) as exc:
        return _failed(interpreter, f"unreadable device listing: {exc}")
