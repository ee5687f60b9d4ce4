"""The validated ``[backend.options]`` of an ``ort-vitisai`` stage and their translation.

The typed fields become the VitisAI provider options of the worker's ``load`` (the Ryzen AI
spellings: ``config_file``, ``cache_dir``, ``cache_key``, ``target``, ``xclbin``). Kept apart
from the hooks so that importing the plugin stays cheap. Every check names the field, the
reason and the value.
"""

from __future__ import annotations

import os
import re
from typing import Any

import attrs

from edge_core.errors import ConfigError
from edge_ort.options import OrtOptions, base_load_config

__all__ = ["OWNED_PROVIDER_OPTIONS", "PROVIDER", "VitisAIOptions", "vitisai_load_config"]

#: The provider as ONNX Runtime lists it (``get_available_providers()``).
PROVIDER = "VitisAIExecutionProvider"
#: Provider options the typed fields own (plus the older camel-case spellings of two).
OWNED_PROVIDER_OPTIONS = ("config_file", "cache_dir", "cache_key", "target", "xclbin",
                          "cacheDir", "cacheKey")
_KEY = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}$")
_TARGET = re.compile(r"^[A-Za-z0-9_]{1,32}$")


def _file(_: object, attribute: attrs.Attribute[str | None], value: str | None) -> None:
    if value is None:
        return
    if not isinstance(value, str) or not os.path.isabs(value):
        raise ConfigError(attribute.name, "must be an absolute path", value)
    if not os.path.isfile(value):
        raise ConfigError(attribute.name, "is not an existing file", value)


def _directory(_: object, attribute: attrs.Attribute[str | None], value: str | None) -> None:
    if value is None:
        return
    if not isinstance(value, str) or not os.path.isabs(value):
        raise ConfigError(attribute.name, "must be an absolute path", value)
    if os.path.exists(value) and not os.path.isdir(value):
        raise ConfigError(attribute.name, "exists and is not a directory", value)


def _cache_key(_: object, attribute: attrs.Attribute[str | None], value: str | None) -> None:
    if value is not None and (not isinstance(value, str) or not _KEY.match(value)
                              or value in (".", "..")):
        raise ConfigError(attribute.name, "must be one folder name of [A-Za-z0-9._-], "
                          "at most 128 characters", value)


def _target(_: object, attribute: attrs.Attribute[str | None], value: str | None) -> None:
    if value is not None and (not isinstance(value, str) or not _TARGET.match(value)):
        raise ConfigError(attribute.name, "must be 1 to 32 characters of [A-Za-z0-9_] "
                          "(Ryzen AI documents X1 and X2)", value)


@attrs.frozen
class VitisAIOptions(OrtOptions):
    """An ``ort-vitisai`` stage's options: the ORT ones plus VitisAI's own.

    Attributes:
        config_file: Absolute path of the VitisAI compile configuration
            (``vaip_config.json``; Ryzen AI requires one for BF16 models).
        cache_dir: Absolute directory where compiled models are cached.
        cache_key: The sub-folder of ``cache_dir`` for this model.
        target: The NPU compile target (Ryzen AI documents ``X1`` and ``X2``).
        xclbin: Absolute path of the NPU binary (Ryzen AI uses it for INT8 models).
        session_per_bucket: Here ``True`` by default: the NPU runs static shapes, so every
            static bucket of the shape set is compiled on its own, and its ``cache_key``
            gets ``-<bucket>`` appended (one VitisAI cache entry per bucket).
    """

    config_file: str | None = attrs.field(default=None, validator=_file)
    cache_dir: str | None = attrs.field(default=None, validator=_directory)
    cache_key: str | None = attrs.field(default=None, validator=_cache_key)
    target: str | None = attrs.field(default=None, validator=_target)
    xclbin: str | None = attrs.field(default=None, validator=_file)
    session_per_bucket: bool = True

    def __attrs_post_init__(self) -> None:
        for key in OWNED_PROVIDER_OPTIONS:
            if key in self.provider_options:
                raise ConfigError(f"provider_options.{key}", "VitisAI's own options are set "
                                  "with the typed fields (config_file, cache_dir, cache_key, "
                                  "target, xclbin)", self.provider_options[key])
        if self.cache_key is not None and self.cache_dir is None:
            raise ConfigError("cache_key", "names a folder of cache_dir, which is not set",
                              self.cache_key)

    def provider_settings(self) -> dict[str, str]:
        """The VitisAI provider options these fields set (unset ones are left out)."""
        fields = ("config_file", "cache_dir", "cache_key", "target", "xclbin")
        return {name: str(getattr(self, name)) for name in fields
                if getattr(self, name) is not None}


def vitisai_load_config(options: VitisAIOptions | None) -> dict[str, Any]:
    """The worker's ``load`` configuration: VitisAI with its options, then CPU."""
    options = options or VitisAIOptions()
    config = base_load_config(PROVIDER, options)
    config["providers"][0][1].update(options.provider_settings())
    config["bucket_keyed_options"] = ["cache_key"]
    return config
