"""Pipeline configuration: the attrs model, strict cattrs structuring and the file loaders.

Typical use::

    from edge_core.config import load_pipeline

    config = load_pipeline("pipeline.toml", validate_backend=plugin_manager_validator)

Every error is a :class:`~edge_core.errors.ConfigError` whose message starts with the full
path of the offending value, e.g. ``stages[1].backend.route.interpreter``.
"""

from __future__ import annotations

from edge_core.config.checks import OS_DOMAINS
from edge_core.config.loading import (
    BackendValidator,
    ToolSettings,
    folder_problem,
    load_pipeline,
    load_pyproject_pipeline,
    load_tool_settings,
    pyproject_name_required,
    pyproject_pipelines,
    read_document,
)
from edge_core.config.model import (
    DEFAULT_MAX_IO_BYTES,
    BackendSection,
    CandidateConfig,
    InputTransform,
    MeasurementConfig,
    PipelineConfig,
    PlacementConfig,
    ResourceBudget,
    RouteConfig,
    StageConfig,
)
from edge_core.config.selection import OBJECTIVES, SELECTIONS, STARTS
from edge_core.config.sizes import ByteSizeError, format_byte_size, parse_byte_size
from edge_core.config.structure import InvalidConfigError, structure_config
from edge_core.config.transforms import ADAPTER_GROUP, resolve_input_transform

__all__ = [
    "ADAPTER_GROUP",
    "DEFAULT_MAX_IO_BYTES",
    "OBJECTIVES",
    "OS_DOMAINS",
    "SELECTIONS",
    "STARTS",
    "BackendSection",
    "BackendValidator",
    "ByteSizeError",
    "CandidateConfig",
    "InputTransform",
    "InvalidConfigError",
    "MeasurementConfig",
    "PipelineConfig",
    "PlacementConfig",
    "ResourceBudget",
    "RouteConfig",
    "StageConfig",
    "ToolSettings",
    "folder_problem",
    "format_byte_size",
    "load_pipeline",
    "load_pyproject_pipeline",
    "load_tool_settings",
    "parse_byte_size",
    "pyproject_name_required",
    "pyproject_pipelines",
    "read_document",
    "resolve_input_transform",
    "structure_config",
]
