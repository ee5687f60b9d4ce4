"""The pipeline configuration model: frozen attrs classes, one per table of a pipeline file.

Field types carry their checks as ``typing.Annotated`` markers (:class:`Check`), which the
cattrs converter in :mod:`edge_core.config.structure` applies while reading a file; the same
checks run as attrs validators when a value is built in code, so both paths obey one rule.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Annotated, Any, Literal

import attrs

from edge_core.config.checks import (
    INTERNAL,
    Check,
    CheckError,
    check_absolute_interpreter,
    check_adapter_or_callable,
    check_byte_size,
    check_entry,
    check_fraction,
    check_identifier,
    check_io_byte_size,
    check_module_path,
    check_os_domain,
    check_pool_name,
    check_positive_byte_size,
    check_positive_int,
    check_replicas,
    check_text,
    check_top_module,
    validator,
)
from edge_core.config.lifecycle import (
    NonNegativeInt,
    NonNegativeSeconds,
    PositiveSeconds,
    RestartOption,
    check_non_negative_int,
    check_non_negative_seconds,
    check_positive_seconds,
    check_restart_mode,
)
from edge_core.config.selection import (
    Margin,
    Objective,
    Selection,
    Start,
    check_margin,
    check_objective,
    check_selection,
    check_start,
)
from edge_core.config.targets import parse_target
from edge_core.errors import ConfigError
from edge_core.placement import PlacementPolicy

if TYPE_CHECKING:
    from edge_core.host.routes import Route as HostRoute

__all__ = [
    "DEFAULT_MAX_IO_BYTES",
    "BackendSection",
    "CandidateConfig",
    "InputTransform",
    "MeasurementConfig",
    "PipelineConfig",
    "PlacementConfig",
    "ResourceBudget",
    "RouteConfig",
    "StageConfig",
]

DEFAULT_MAX_IO_BYTES = 64 * 1024**2
"""Default cap on one request's or result's total tensor bytes on a stage's route (64 MiB)."""

Text = Annotated[str, Check(check_text)]
Identifier = Annotated[str, Check(check_identifier)]
ModulePath = Annotated[str, Check(check_module_path)]
PoolName = Annotated[str, Check(check_pool_name)]
ByteSize = Annotated[int, Check(check_byte_size)]
PositiveByteSize = Annotated[int, Check(check_positive_byte_size)]
IoByteSize = Annotated[int, Check(check_io_byte_size)]
PositiveInt = Annotated[int, Check(check_positive_int)]
Replicas = Annotated[int, Check(check_replicas)]
Fraction = Annotated[float, Check(check_fraction)]
OsDomain = Annotated[str, Check(check_os_domain)]
Interpreter = Annotated[str, Check(check_absolute_interpreter)]
EntryRef = Annotated[str, Check(check_entry)]
TopModule = Annotated[str, Check(check_top_module)]
TransformRef = Annotated[str, Check(check_adapter_or_callable)]


def _stage_tuple(value: Iterable[StageConfig]) -> tuple[StageConfig, ...]:
    return tuple(value)


def _candidate_tuple(value: Iterable[CandidateConfig]) -> tuple[CandidateConfig, ...]:
    return tuple(value)


def _text_tuple(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


def _path_tuple(value: Iterable[str | Path]) -> tuple[Path, ...]:
    return tuple(Path(item) for item in value)


def _frozen_mapping(value: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(value))


def _frozen_options(value: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(copy.deepcopy(dict(value)))


def _check_pool_sizes(positive: bool) -> Any:
    size = check_positive_byte_size if positive else check_byte_size

    def run(_instance: Any, attribute: attrs.Attribute[Any], value: Mapping[str, Any]) -> None:
        for pool, nbytes in value.items():
            try:
                check_pool_name(pool)
                size(nbytes)
            except CheckError as exc:
                raise ConfigError(f"{attribute.name}[{pool!r}]", exc.reason, exc.value) from None

    return run


def _check_modules(_instance: Any, attribute: attrs.Attribute[Any], value: tuple[str, ...]) -> None:
    for index, module in enumerate(value):
        try:
            check_module_path(module)
        except CheckError as exc:
            raise ConfigError(f"{attribute.name}[{index}]", exc.reason, exc.value) from None


def _check_targets(_instance: Any, attribute: attrs.Attribute[Any], value: tuple[str, ...]) -> None:
    for index, text in enumerate(value):
        parse_target(text, f"{attribute.name}[{index}]")


@attrs.frozen
class RouteConfig:
    """How a stage's worker is started: interpreter, entry, OS domain (``backend.route``).

    Optional on a stage; without one the backend decides (CPU backends default to the
    controller's own interpreter). :meth:`to_host_route` builds the host layer's
    :class:`edge_core.host.routes.Route`, which also checks that the interpreter exists.
    """

    name: Identifier = attrs.field(validator=validator(check_identifier))
    """A label for the route, recorded in the execution plan (``"vendor-env"``)."""
    interpreter: Interpreter = attrs.field(validator=validator(check_absolute_interpreter))
    """Absolute path of the Python interpreter that runs the worker."""
    entry: EntryRef | None = attrs.field(
        default=None, validator=attrs.validators.optional(validator(check_entry))
    )
    """Worker entry ``package.module:factory``; ``None``: the backend's own entry."""
    os_domain: OsDomain | None = attrs.field(
        default=None, validator=attrs.validators.optional(validator(check_os_domain))
    )
    """``posix``, ``wsl`` or ``windows``; ``None``: the controller's own domain."""
    stage: tuple[TopModule, ...] = attrs.field(default=(), converter=_text_tuple)
    """Top-level packages copied next to ``edge_contracts`` for a foreign interpreter."""
    python_path: tuple[Path, ...] = attrs.field(default=(), converter=_path_tuple)
    """Extra directories for the worker's ``PYTHONPATH`` (resolved against the config file)."""
    env: Mapping[str, str] = attrs.field(factory=dict, converter=_frozen_mapping)
    """Variables set in the worker's environment as given (besides the allowlist)."""

    def __attrs_post_init__(self) -> None:
        try:
            check_absolute_interpreter(self.interpreter, self.os_domain)
        except CheckError as exc:
            raise ConfigError("interpreter", exc.reason, exc.value) from None
        for name, value in self.env.items():
            if not isinstance(value, str):
                raise ConfigError(f"env.{name}", "expected a string", value)
            if not name.isidentifier() or not name.isascii():
                raise ConfigError(f"env.{name}", "must be a variable name", name)
            if name == "PYTHONPATH":
                raise ConfigError(f"env.{name}", "is built from python_path", name)
        for index, module in enumerate(self.stage):
            try:
                check_top_module(module)
            except CheckError as exc:
                raise ConfigError(f"stage[{index}]", exc.reason, exc.value) from None

    def to_host_route(self, default_entry: str, path: str = "route") -> HostRoute:
        """Build the host layer's route; ``default_entry`` applies when ``entry`` is unset.

        Raises:
            ConfigError: at ``path`` plus the field, when the host refuses the route (the
                interpreter does not exist or is not executable, a directory is missing).

        """
        from edge_core.host.errors import RouteRefused
        from edge_core.host.routes import Route

        try:
            return Route(
                name=self.name,
                interpreter=self.interpreter,
                entry=self.entry or default_entry,
                **({"os_domain": self.os_domain} if self.os_domain else {}),
                stage=self.stage,
                python_path=tuple(str(p) for p in self.python_path),
                env=dict(self.env),
            )
        except RouteRefused as exc:
            field = exc.path.removeprefix("route")
            raise ConfigError(f"{path}{field}", exc.reason, exc.value) from None


@attrs.frozen
class BackendSection:
    """Which backend runs a stage, its backend-owned options, and an optional route.

    ``options`` is the raw table, owned by the plugin that provides the backend; its
    config hook turns it into ``validated`` (``None`` when no validator was given).
    """

    name: Identifier = attrs.field(validator=validator(check_identifier))
    """Backend name as a plugin declares it (``"ort-cpu"``)."""
    options: Mapping[str, object] = attrs.field(
        factory=dict, converter=_frozen_options, eq=False, hash=False
    )
    """The raw, read-only ``options`` table, as written."""
    route: RouteConfig | None = None
    """Explicit worker route, or ``None`` for the backend's default route."""
    validated: object = attrs.field(default=None, eq=False, hash=False, metadata={INTERNAL: True})
    """What the owning plugin's config hook returned for ``options`` (``None`` if unchecked)."""


@attrs.frozen
class PlacementConfig:
    """Where a stage's graph must run, checked by the warm-up placement gate."""

    target: Text | None = attrs.field(
        default=None, validator=attrs.validators.optional(validator(check_text))
    )
    """Execution provider or device the backend must place the graph on; ``None``: default."""
    min_fraction_on_target: Fraction = attrs.field(default=1.0, validator=validator(check_fraction))
    """Smallest share of nodes that must run on ``target``, in (0, 1]; 1.0 means all."""
    allowed_providers: tuple[Text, ...] = attrs.field(default=(), converter=_text_tuple)
    """Providers allowed to run the remaining nodes; empty: none besides ``target``."""

    def to_policy(self) -> PlacementPolicy:
        """Return the placement gate's policy for this stage."""
        return PlacementPolicy(
            target=self.target,
            min_fraction_on_target=self.min_fraction_on_target,
            allowed_providers=self.allowed_providers,  # converter=tuple upstream
        )


@attrs.frozen
class ResourceBudget:
    """A stage's memory budget: pool ceilings and the demands reserved before loading."""

    capacities: Mapping[PoolName, PositiveByteSize] = attrs.field(
        factory=dict, converter=_frozen_mapping, validator=_check_pool_sizes(True)
    )
    """Pre-load ceilings per pool; each must not exceed the pool's observed total."""
    demands: Mapping[PoolName, PositiveByteSize] = attrs.field(
        factory=dict, converter=_frozen_mapping, validator=_check_pool_sizes(True)
    )
    """Bytes to reserve per pool, including the load peak; override the backend's estimate."""


@attrs.frozen
class InputTransform:
    """The model-owned function that turns the previous stage's outputs into this one's inputs.

    ``reference`` is ``"package.module:function"`` (kind ``callable``) or the name of an
    adapter registered in the ``edge.adapters`` entry-point group (kind ``adapter``).
    Nothing is imported while the configuration is read.
    """

    reference: TransformRef = attrs.field(validator=validator(check_adapter_or_callable))
    """The reference exactly as written."""

    @property
    def kind(self) -> Literal["callable", "adapter"]:
        """``"callable"`` for ``module:function``, ``"adapter"`` for an entry-point name."""
        return "callable" if ":" in self.reference else "adapter"


@attrs.frozen
class CandidateConfig:
    """One backend a stage may run on, in the stage's order of preference (``candidates``).

    A complete backend section; ``manifest``, ``placement`` and ``resources`` left out
    (``None``) are the stage's own.
    """

    backend: BackendSection
    """Backend name, options and route of this candidate."""
    manifest: Path | None = None
    """This candidate's own artifact manifest, where its bundle differs from the stage's."""
    placement: PlacementConfig | None = None
    """This candidate's placement policy; ``None``: the stage's."""
    resources: ResourceBudget | None = None
    """This candidate's ceilings and demands; ``None``: the stage's."""


@attrs.frozen
class StageConfig:
    """One stage of a pipeline: a model run by one backend on one route."""

    id: Identifier = attrs.field(validator=validator(check_identifier))
    """Unique stage id within the pipeline."""
    backend: BackendSection
    """Backend name, options and route."""
    manifest: Path | None = None
    """Absolute path of the artifact manifest (resolved against the config file's folder)."""
    max_io_bytes: IoByteSize = attrs.field(
        default=DEFAULT_MAX_IO_BYTES, validator=validator(check_io_byte_size)
    )
    """Largest total tensor payload of one request or result on this stage's route."""
    placement: PlacementConfig = attrs.field(factory=PlacementConfig)
    """Placement requirements for the warm-up gate."""
    resources: ResourceBudget = attrs.field(factory=ResourceBudget)
    """Ceilings and demands per memory pool."""
    input_transform: InputTransform | None = None
    """Required on every stage but the first; the first stage takes the caller's inputs."""
    replicas: Replicas = attrs.field(default=1, validator=validator(check_replicas))
    """How many workers serve this stage, each reserved and gated (default 1)."""
    shapes: tuple[Text, ...] = attrs.field(default=(), converter=_text_tuple)
    """Names of the bundle's shape-set entries to serve (warm up, gate, accept); empty: all.
    Serving fewer buckets saves warm-up time and memory; an unknown name is refused."""
    inputs_from: tuple[Identifier, ...] = attrs.field(default=(), converter=_text_tuple)
    """Where this stage's inputs come from: stage ids, or ``"input"`` for the pipeline's own
    input. Empty means the previous stage (the pipeline input for the first). The runtime
    serves linear chains only and refuses fan-out, joins and several final outputs."""
    call_timeout_s: PositiveSeconds | None = attrs.field(
        default=None, validator=attrs.validators.optional(validator(check_positive_seconds))
    )
    """Most seconds one call of this stage may take, its sending included; ``None``: the
    default of the backend's kind (120 s for graph stages, 600 s for generate-only stages)."""
    restart: RestartOption = attrs.field(default="never", validator=validator(check_restart_mode))
    """``"never"``: a failed (or cancel-retired) stage waits for ``restart()``;
    ``"on-failure"``: it is restarted automatically through the whole gate."""
    max_restarts: NonNegativeInt = attrs.field(
        default=3, validator=validator(check_non_negative_int)
    )
    """Consecutive automatic restart attempts before the stage stays failed."""
    restart_backoff_s: NonNegativeSeconds = attrs.field(
        default=0.5, validator=validator(check_non_negative_seconds)
    )
    """Wait before the first automatic attempt, doubled for each further one (≤ 30 s)."""
    reference_backend: Identifier | None = attrs.field(
        default=None, validator=attrs.validators.optional(validator(check_identifier))
    )
    """A backend on an independent runtime (``"ort-cpu"``, say) that core starts after the
    stage opened, to run the bundle's example inputs and compare with this stage's outputs
    within its bound: a match earns ``complete-model`` when the bundle has no expected
    outputs of its own (docs/evidence.md). Never the stage's own backend."""
    candidates: tuple[CandidateConfig, ...] = attrs.field(default=(), converter=_candidate_tuple)
    """Backends to try in order of preference at open; the first that passes the whole
    gate serves. Empty: ``backend`` alone. With candidates, ``backend`` is the first's."""

    def choices(self) -> tuple[StageConfig, ...]:
        """The stage as each candidate would run it, in order (just itself without any)."""
        if not self.candidates:
            return (self,)
        return tuple(
            attrs.evolve(
                self, backend=c.backend, manifest=c.manifest or self.manifest,
                placement=c.placement or self.placement,
                resources=c.resources or self.resources, candidates=(),
            )
            for c in self.candidates
        )


@attrs.frozen
class MeasurementConfig:
    """How a measured selection times its candidates (the pipeline's ``[measurement]`` table).

    Candidates are raced: each is timed inside the whole chain, and one stops being timed
    as soon as its lower bound is worse than the leader's upper bound plus ``margin``
    (docs/placement.md, "Placement by measurement").
    """

    margin: Margin = attrs.field(default=0.05, validator=validator(check_margin))
    """Relative margin in [0, 1) within which two candidates tie (the earlier-listed one is
    kept) and beyond which a raced candidate stops; default 0.05 (5 %)."""
    split_margin: Margin = attrs.field(default=0.05, validator=validator(check_margin))
    """How much better than the fewest-backend placement a placement across backends must
    be, relatively, to be kept; default 0.05 (5 %)."""
    latency_bound_s: PositiveSeconds | None = attrs.field(
        default=None, validator=attrs.validators.optional(validator(check_positive_seconds))
    )
    """``objective = "memory"`` only, and required there: the largest p50 of the whole chain,
    in seconds, that a placement may have to be chosen for its memory."""
    budget_s: PositiveSeconds = attrs.field(default=60.0,
                                            validator=validator(check_positive_seconds))
    """Seconds of timing each stage (or each joint race) may spend; the race is decided
    on what was measured when it runs out; default 60."""
    min_samples: PositiveInt = attrs.field(default=3, validator=validator(check_positive_int))
    """Timed requests per candidate before it may be stopped; default 3."""
    max_samples: PositiveInt = attrs.field(default=20, validator=validator(check_positive_int))
    """Timed requests per candidate at most; default 20."""
    warmup_calls: NonNegativeInt = attrs.field(default=1,
                                               validator=validator(check_non_negative_int))
    """Untimed requests per candidate before its timing starts; default 1."""
    joint_limit: PositiveInt = attrs.field(default=16, validator=validator(check_positive_int))
    """Most combinations measured jointly when several stages have candidates; more are
    measured greedily, stage by stage in data-flow order; default 16."""
    reuse: bool = True
    """Reuse a stored decision whose key matches (``false``: measure at every open)."""

    def __attrs_post_init__(self) -> None:
        if self.min_samples > self.max_samples:
            raise ConfigError("min_samples", f"must not exceed max_samples "
                              f"({self.max_samples})", self.min_samples)

    def to_json(self) -> dict[str, Any]:
        """The table's values, JSON-ready."""
        return attrs.asdict(self)


@attrs.frozen
class PipelineConfig:
    """A whole pipeline: a linear chain of stages admitted and loaded as one plan."""

    name: Identifier = attrs.field(validator=validator(check_identifier))
    """Pipeline name (the file's ``name`` or the ``[tool.edge.pipelines.<name>]`` key)."""
    stages: tuple[StageConfig, ...] = attrs.field(converter=_stage_tuple)
    """Stages in data-flow order."""
    admission: PositiveInt = attrs.field(default=1, validator=validator(check_positive_int))
    """How many requests the pipeline admits at once (default 1)."""
    plugins: tuple[ModulePath, ...] = attrs.field(
        default=(), converter=_text_tuple, validator=_check_modules
    )
    """Local plugin modules to load, as pytest's ``-p`` (``[tool.edge]`` ones come first)."""
    capacities: Mapping[PoolName, PositiveByteSize] = attrs.field(
        factory=dict, converter=_frozen_mapping, validator=_check_pool_sizes(True)
    )
    """Pipeline-wide pool ceilings; combined with the stages' own by :meth:`ceilings`."""
    prepare: InputTransform | None = None
    """Model-owned function ``prepare(source: str) -> inputs`` that turns what ``edge run
    --input`` names (an image path, say) into the first stage's inputs. One that also
    takes an ``input_buffer`` keyword is given ``pipeline.input_buffer`` to write a large
    input straight into shared memory (sent without a copy)."""
    finish: InputTransform | None = None
    """Model-owned function ``finish(outputs, inputs, bundles) -> JSON`` that turns the
    final stage's outputs into the answer ``edge run`` prints (recognised text, say);
    ``bundles`` maps stage id to its verified bundle directory, for model assets such as
    a character table."""
    quality: InputTransform | None = None
    """Model-owned task-level check ``quality(pairs) -> {metric: value}`` that ``edge
    profile`` runs on the ``golden`` set's ``(answer, truth)`` pairs (docs/evidence.md)."""
    golden: Text | None = None
    """The golden set file (inputs and their known answers, pass criteria), relative to
    the pipeline file; read by ``edge profile`` only."""
    targets: tuple[Text, ...] = attrs.field(
        default=(), converter=_text_tuple, validator=_check_targets
    )
    """Product targets (``"ttft_p95_ms <= 800"``, ``METRIC[@cN] OP NUMBER``) the evidence
    records judge performance against; none: performance is ``unjudged``. Their form is
    checked when the file is read; ``edge profile`` judges them."""
    selection: Selection = attrs.field(default="measured", validator=validator(check_selection))
    """How a stage with several candidates gets its backend: ``"measured"`` (default: each
    candidate that passes every gate is timed inside the whole chain and the best on
    ``objective`` serves) or ``"first-passing"`` (the first that passes serves)."""
    objective: Objective = attrs.field(default="latency", validator=validator(check_objective))
    """What a measured selection minimises: ``"latency"`` (p50 of the chain, one request at
    a time), ``"throughput"`` (the most requests per second at ``admission``) or
    ``"memory"`` (least reserved memory within ``measurement.latency_bound_s``)."""
    start: Start = attrs.field(default="all-ready", validator=validator(check_start))
    """``"all-ready"``: serve once every stage's choice is made; ``"first-ready"``: serve
    as soon as each stage has one ready candidate while the others open, are gated and
    measured in the background, switching at a request boundary."""
    workload: tuple[Path, ...] = attrs.field(default=(), converter=_path_tuple)
    """What a measurement times: sources for ``prepare`` (an image, say), or ``.npz`` files
    of first-stage inputs without it (resolved against the config file). Empty: the
    ``--input`` of ``edge run`` / ``edge plan``, else the bundles' own examples."""
    measurement: MeasurementConfig = attrs.field(factory=MeasurementConfig)
    """How candidates are raced (``[measurement]``)."""
    source: Path | None = attrs.field(default=None, eq=False, metadata={INTERNAL: True})
    """The file the configuration was read from, when it came from one."""

    def __attrs_post_init__(self) -> None:
        if not self.stages:
            raise ConfigError("stages", "a pipeline needs at least one stage", [])
        bound = self.measurement.latency_bound_s
        if self.objective == "memory" and bound is None:
            raise ConfigError("measurement.latency_bound_s",
                              'required with objective = "memory"')
        if self.objective != "memory" and bound is not None:
            raise ConfigError("measurement.latency_bound_s",
                              f'applies only to objective = "memory" (objective is '
                              f'{self.objective!r})', bound)
        seen: dict[str, int] = {}
        for index, stage in enumerate(self.stages):
            if stage.id in seen:
                raise ConfigError(
                    f"stages[{index}].id",
                    f"duplicate stage id (also stages[{seen[stage.id]}])",
                    stage.id,
                )
            seen[stage.id] = index
            if stage.candidates and stage.candidates[0].backend != stage.backend:
                raise ConfigError(
                    f"stages[{index}].backend",
                    "a stage with candidates runs the first candidate's backend first",
                    stage.backend.name,
                )
            if index == 0 and stage.input_transform is not None:
                raise ConfigError(
                    "stages[0].input_transform",
                    "not allowed on the first stage, which takes the caller's inputs",
                    stage.input_transform.reference,
                )
            if index > 0 and stage.input_transform is None:
                raise ConfigError(
                    f"stages[{index}].input_transform",
                    "required on every stage after the first",
                )

    def stage(self, stage_id: str) -> StageConfig:
        """Return the stage with id ``stage_id``; ``KeyError`` if there is none."""
        for stage in self.stages:
            if stage.id == stage_id:
                return stage
        raise KeyError(stage_id)

    def ceilings(self) -> dict[str, int]:
        """Pool ceilings for the ledger: the smallest one declared anywhere for each pool.

        Several stages may name a ceiling for the same pool; the strictest one wins, so no
        stage can loosen a limit another stage relies on.
        """
        merged: dict[str, int] = dict(self.capacities)
        for stage in self.stages:
            for pool, nbytes in stage.resources.capacities.items():
                merged[pool] = min(nbytes, merged.get(pool, nbytes))
        return merged

    def demands(self) -> dict[str, dict[str, int]]:
        """Return declared demands per stage id (a stage that declares none maps to ``{}``)."""
        return {stage.id: dict(stage.resources.demands) for stage in self.stages}

    def to_json(self) -> dict[str, Any]:
        """Return a JSON-able summary (no backend options) for execution plans and reports."""
        return {
            "name": self.name,
            "admission": self.admission,
            "plugins": list(self.plugins),
            "capacities": dict(self.capacities),
            "prepare": self.prepare.reference if self.prepare else None,
            "finish": self.finish.reference if self.finish else None,
            "quality": self.quality.reference if self.quality else None,
            "golden": self.golden,
            "targets": list(self.targets),
            "source": str(self.source) if self.source else None,
            "selection": self.selection,
            "objective": self.objective,
            "start": self.start,
            "workload": [str(p) for p in self.workload],
            "measurement": self.measurement.to_json(),
            "stages": [
                {
                    "id": stage.id,
                    "backend": stage.backend.name,
                    "route": _route_json(stage.backend.route),
                    "manifest": str(stage.manifest) if stage.manifest else None,
                    "max_io_bytes": stage.max_io_bytes,
                    "placement": {
                        "target": stage.placement.target,
                        "min_fraction_on_target": stage.placement.min_fraction_on_target,
                        "allowed_providers": list(stage.placement.allowed_providers),
                    },
                    "capacities": dict(stage.resources.capacities),
                    "demands": dict(stage.resources.demands),
                    "inputs_from": list(stage.inputs_from),
                    "replicas": stage.replicas,
                    "call_timeout_s": stage.call_timeout_s,
                    "restart": stage.restart,
                    "max_restarts": stage.max_restarts,
                    "restart_backoff_s": stage.restart_backoff_s,
                    "shapes": list(stage.shapes),
                    "reference_backend": stage.reference_backend,
                    "candidates": [
                        {"backend": c.backend.name, "route": _route_json(c.backend.route),
                         "manifest": str(c.manifest) if c.manifest else None}
                        for c in stage.candidates
                    ],
                    "input_transform": (
                        stage.input_transform.reference if stage.input_transform else None
                    ),
                }
                for stage in self.stages
            ],
        }


def _route_json(route: RouteConfig | None) -> dict[str, Any] | None:
    if route is None:
        return None
    return {
        "name": route.name,
        "interpreter": route.interpreter,
        "entry": route.entry,
        "os_domain": route.os_domain,
        "stage": list(route.stage),
        "python_path": [str(p) for p in route.python_path],
        "env": sorted(route.env),  # names only
    }
