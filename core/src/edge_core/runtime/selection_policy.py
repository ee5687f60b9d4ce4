"""How a pipeline's candidates are chosen at open, and a first-ready start's background work.

:func:`open_selected` is what :meth:`Pipeline.open
<edge_core.runtime.pipeline.Pipeline.open>` asks first. For a pipeline where some stage
lists more than one candidate it opens the stages by the pipeline's ``selection`` and
``start`` and returns a :class:`SelectionPolicy` (else ``None``, and the pipeline opens
as before: first-passing, or every stage on its one backend):

* ``start = "all-ready"``, ``selection = "measured"``:
  :class:`~edge_core.runtime.measured_selection.MeasuredOpen` measures every passing
  candidate (or reuses a stored decision) before the pipeline serves;
* ``start = "first-ready"`` (:class:`FirstReadyPolicy`): each stage opens one candidate
  — the fastest to open, as the stored decision's (or the previous decision's) open
  times say, else the first listed — and the pipeline serves on those at once. Once the
  first answer is out (or :data:`FIRST_ANSWER_WAIT_S` passed without one), in the
  background the other candidates open, are gated and measured (``measured``), or the
  stored decision's candidates open (reused), or the earlier-listed candidates are tried
  (``first-passing``); when a better placement is ready the pipeline switches to it at a
  request boundary (:class:`~edge_core.runtime.serving_lineup.ServingLineup`): requests
  in flight finish where they started, and the old candidate is retired, verified, once
  none holds it. The switch is an event in the plan (``selection.switches``) and in the
  pipeline's health.

**The ledger and candidates of one stage.** Every candidate a policy opens is reserved
before it loads, like any stage. Two candidates of one stage are held at once only when
the ledger admits both (each under its own owner, ``pipeline/stage~c``), never by
exceeding a pool or a ceiling: a background candidate that does not fit waits (up to
``measurement.budget_s``) for room, and is skipped otherwise, and the plan says which.
A first-passing open still holds one candidate of a stage at a time.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from edge_core.config.model import PipelineConfig
from edge_core.errors import ResourceUnavailable
from edge_core.runtime.candidate_entries import (
    CHOSEN,
    CandidatesRefused,
    candidate_path,
    refusal_entry,
)
from edge_core.runtime.linear_chain import check_linear_chain
from edge_core.runtime.measured_selection import (
    PASSED,
    MeasuredOpen,
    MeasurementStopped,
    selection_record,
)
from edge_core.runtime.opener import StageOpener
from edge_core.runtime.placement_timing import Held, candidate_label, open_held
from edge_core.runtime.serving_lineup import Serving, ServingLineup
from edge_core.runtime.stage_slot import StageSlot
from edge_core.selection.key import DecisionKey, decision_key
from edge_core.selection.store import DecisionStore, Lookup, StoredDecision
from edge_core.selection.workload import Workload, load_workload

__all__ = ["FirstReadyPolicy", "SelectionPolicy", "open_selected"]

SWITCH_WAIT_S = 600.0
"""How long a switched-out placement waits for the requests it still holds."""

ROOM_POLL_S = 0.25
"""How often a background candidate that does not fit asks the ledger again."""

FIRST_ANSWER_WAIT_S = 2.0
"""How long the background work waits for the first answer before it starts opening
(on a machine with few cores, starting workers beside the first request slows it)."""


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _choosing(config: PipelineConfig) -> bool:
    return any(len(stage.candidates) > 1 for stage in config.stages)


class SelectionPolicy:
    """The outcome of choosing at open: the slots that serve and the plan's record.

    Args:
        config: The pipeline.
        slots: The chosen candidates' slots, in data-flow order.
        record: The plan's ``selection`` section.
        decision: Where every stage's placement came from (one word, see
            :data:`~edge_core.runtime.serving_lineup.DECISIONS`).
    """

    def __init__(self, config: PipelineConfig, slots: Sequence[StageSlot],
                 record: dict[str, Any], decision: str) -> None:
        self.config = config
        self.slots = list(slots)
        self.record = record
        self._decision = decision

    @classmethod
    def fixed(cls, config: PipelineConfig) -> SelectionPolicy:
        """The policy of a pipeline opened without a choice to make (or first-passing)."""
        choosing = _choosing(config)
        record = selection_record(
            config, "first-passing" if choosing else "only",
            "the first candidate that passes serves" if choosing
            else "no stage has a choice of candidates")
        return cls(config, (), record, "first-passing" if choosing else "only")

    def decisions(self) -> dict[str, str]:
        """Stage id → where its placement came from (``only`` for a stage without choice)."""
        return {stage.id: self._decision if len(stage.candidates) > 1 else "only"
                for stage in self.config.stages}

    def measured_at(self) -> str | None:
        """When the serving placement was measured, if it was."""
        value = self.record.get("measured_at")
        return value if isinstance(value, str) else None

    def serving(self, lineup: ServingLineup) -> None:
        """The pipeline serves on ``lineup`` now (a first-ready start begins its work)."""

    def stop(self) -> None:
        """The pipeline closes: end any background work and retire what it held."""

    def finishing(self) -> list[StageSlot]:
        """Slots switched out and not yet retired (the pipeline's close retires them)."""
        return []

    def plan_record(self) -> dict[str, Any]:
        """The plan's ``selection`` section now."""
        return dict(self.record)


def open_selected(opener: StageOpener, *, workload: Workload | None = None,
                  store: DecisionStore | None = None,
                  remeasure: bool = False) -> SelectionPolicy | None:
    """Open by the pipeline's selection and start; ``None`` when the plain opens apply.

    Raises:
        ConfigError: the pipeline's ``workload`` cannot be read (nothing reserved).
        TopologyRefused / CandidatesRefused / a stage's own error, as opening does.
    """
    config = opener.config
    if not _choosing(config) or (config.start == "all-ready"
                                 and config.selection == "first-passing"):
        return None
    check_linear_chain(config)
    workload = workload or load_workload(config)
    store = store if store is not None else DecisionStore()
    key = None
    if config.selection == "measured":
        key = decision_key(config, opener.plugins,
                           workload=workload.sources if workload is not None else ())
    if config.start == "first-ready":
        return FirstReadyPolicy.open(opener, workload, store=store, key=key,
                                     remeasure=remeasure)
    measured = MeasuredOpen(opener, workload, store=store, key=key, remeasure=remeasure)
    slots = measured.open()
    word = {"reused": "reused", "measured": "measured"}.get(measured.record["decision"],
                                                            "first-passing")
    policy = SelectionPolicy(config, slots, measured.record, word)
    return policy


def _open_order(stage: Any, hint: StoredDecision | None) -> list[int]:
    """Candidate numbers, fastest to open first as ``hint``'s entries say, else as listed."""
    numbers = list(range(len(stage.choices())))
    if hint is None:
        return numbers
    stages = hint.decision.get("stages")
    entry = stages.get(stage.id) if isinstance(stages, Mapping) else None
    entries = entry.get("entries") if isinstance(entry, Mapping) else None
    listed = entries if isinstance(entries, list) else []
    times = {e["candidate"]: e["open_s"] for e in listed
             if isinstance(e, Mapping) and isinstance(e.get("candidate"), int)
             and isinstance(e.get("open_s"), int | float)
             and e.get("outcome") in (CHOSEN, PASSED)}
    known = sorted((n for n in numbers if n in times), key=lambda n: (times[n], n))
    return known + [n for n in numbers if n not in times]


class FirstReadyPolicy(SelectionPolicy):
    """``start = "first-ready"``: serve on one ready candidate per stage, choose meanwhile.

    See the module's docstring. The background thread owns every candidate it opens
    until it switches the pipeline to them or retires them; :meth:`stop` ends it.
    """

    def __init__(self, opener: StageOpener, foreground: Sequence[Held], record: dict[str, Any],
                 *, workload: Workload | None, store: DecisionStore, key: DecisionKey | None,
                 stored: StoredDecision | None) -> None:
        super().__init__(opener.config, [s for h in foreground for s in h.slots], record,
                         "first-ready")
        self.opener = opener
        self.foreground = list(foreground)
        self.workload = workload
        self.store = store
        self.key = key
        self.stored = stored
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._owned: list[Held] = []  # opened in the background, not (yet) serving
        self._old: list[StageSlot] = []  # switched out, waiting for their requests
        self._decided: dict[str, str] = {}

    @classmethod
    def open(cls, opener: StageOpener, workload: Workload | None, *, store: DecisionStore,
             key: DecisionKey | None, remeasure: bool) -> FirstReadyPolicy:
        """Open the foreground: each stage's fastest-to-open candidate that passes.

        Raises:
            CandidatesRefused: some stage had no candidate pass (everything retired).
            A stage's own error, unchanged, when it lists no candidates.
        """
        config = opener.config
        lookup: Lookup | None = None
        if key is not None and config.measurement.reuse and not remeasure:
            lookup = store.load(key, config)
        stored = lookup.found if lookup is not None else None
        hint = stored or (lookup.previous if lookup is not None else None)
        record = selection_record(config, "first-ready", "serving on the first ready "
                                  "candidates; choosing in the background")
        record["key"] = key.digest if key is not None else None
        record["warning"] = lookup.warning if lookup is not None else None
        if remeasure:
            record["note"] += " (--remeasure)"
        foreground: list[Held] = []
        try:
            for index, stage in enumerate(config.stages):
                foreground.append(_open_first(opener, index, stage, _open_order(stage, hint)))
        except BaseException as error:
            opener.retire([slot for h in foreground for slot in h.slots])
            if isinstance(error, CandidatesRefused):
                error.tried = {sid: [dict(t) for t in tries]
                               for sid, tries in opener.tried.items()}
            raise
        record["background"] = {"state": "starting", "steps": []}
        return cls(opener, foreground, record, workload=workload, store=store, key=key,
                   stored=stored)

    def decisions(self) -> dict[str, str]:
        """Stage id → ``first-ready`` until a switch decided it, ``only`` without a choice."""
        return {stage.id: self._decided.get(stage.id, "first-ready")
                if len(stage.candidates) > 1 else "only" for stage in self.config.stages}

    # -- the background ------------------------------------------------------------------

    def serving(self, lineup: ServingLineup) -> None:
        """Start choosing in the background while the pipeline serves on ``lineup``."""
        self._thread = threading.Thread(target=self._run, args=(lineup,),
                                        name=f"edge-first-ready-{self.config.name}",
                                        daemon=True)
        self._thread.start()

    def _step(self, text: str) -> None:
        with self._lock:
            self.record["background"]["steps"].append({"at": _now(), "step": text})
        self.opener.say(f"first-ready: {text}")

    def _run(self, lineup: ServingLineup) -> None:
        # the first request goes first: opening workers beside it would slow it down
        lineup.first_answered.wait(FIRST_ANSWER_WAIT_S)
        self.record["background"]["state"] = "running"
        measured_at: str | None
        try:
            if self.stored is not None:
                chosen = self._decided_candidates(self.stored)
                word, measured_at = "reused", self.stored.measured_at
                self.record.update(decision="reused", measured_at=measured_at,
                                   note=f"measured on {measured_at}, reused; served on the "
                                        "first ready candidates meanwhile")
                for key in ("workload", "schedule", "races", "split"):
                    self.record[key] = (self.stored.decision.get("record") or {}).get(key)
            elif self.config.selection == "measured":
                chosen = self._measured()
                word, measured_at = "measured", self.record.get("measured_at")
            else:
                chosen = self._first_passing()
                word, measured_at = "first-passing", None
            if chosen is not None and not self._stopping.is_set():
                self._switch(lineup, chosen, word, measured_at)
            self._release_owned()  # whatever was opened and does not serve
            self.record["background"]["state"] = ("stopped" if self._stopping.is_set()
                                                  else "done")
        except BaseException as error:  # serving goes on where it is
            # an interruption raised on this thread (no signal is delivered here) ends
            # the background work as an error does: there is no caller to raise it to
            self.record["background"].update(state="failed",
                                             error=f"{type(error).__name__}: {error}")
            self.opener.say(f"first-ready: background work failed: {error!r}")
            self._release_owned()

    def _room(self, index: int, number: int) -> Held | None:
        """Open candidate ``number`` of stage ``index`` once the ledger has room for it.

        Waits up to ``measurement.budget_s`` for room; ``None`` when it never came (or
        the pipeline is closing), recorded as skipped.
        """
        stage = self.config.stages[index]
        choice = stage.choices()[number]
        end = time.monotonic() + self.config.measurement.budget_s
        waited = False
        while not self._stopping.is_set():
            try:
                held = open_held(self.opener, index, number, choice,
                                 candidate_path(index, stage, number), tag=True)
            except ResourceUnavailable as error:
                if time.monotonic() >= end:
                    self._step(f"{stage.id}: {choice.backend.name}[{number}] skipped: the "
                               f"ledger did not admit it beside the serving candidate "
                               f"({error})")
                    return None
                if not waited:
                    self._step(f"{stage.id}: {choice.backend.name}[{number}] waits for room "
                               f"in the ledger")
                    waited = True
                self._stopping.wait(ROOM_POLL_S)
                continue
            with self._lock:
                self._owned.append(held)
            self._step(f"{stage.id}: {held.backend}[{number}] open in {held.open_s:.2f} s")
            return held
        return None

    def _decided_candidates(self, stored: StoredDecision) -> list[Held] | None:
        chosen: list[Held] = []
        for index, stage in enumerate(self.config.stages):
            target = int(stored.decision["stages"][stage.id]["choice"])
            current = self.foreground[index]
            if current.number == target:
                chosen.append(current)
                continue
            held = self._room(index, target)
            if held is None:
                return None
            chosen.append(held)
        return chosen

    def _first_passing(self) -> list[Held] | None:
        chosen: list[Held] = []
        for index, stage in enumerate(self.config.stages):
            current = self.foreground[index]
            better: Held | None = None
            for number in range(current.number):  # the earlier-listed, in order
                try:
                    better = self._room(index, number)
                except Exception as error:  # refused: the next earlier one
                    self._step(f"{stage.id}: {stage.choices()[number].backend.name}[{number}]"
                               f" refused: {refusal_entry('', error)['layer']}")
                    continue
                if better is not None:
                    break
            chosen.append(better or current)
        return chosen

    def _measured(self) -> list[Held] | None:
        # the others open beside the serving ones, through the ledger like any candidate
        measured = MeasuredOpen(self.opener, self.workload, store=self.store, key=self.key,
                                remeasure=True, seed=self.foreground,
                                stop=self._stopping.is_set)
        measured.record = self.record  # one record: the plan shows progress as it goes
        self.record.update(decision="measured",
                           note="measuring in the background while serving")
        self._step("opening and measuring the other candidates")
        try:
            chosen = measured.measure()
        except MeasurementStopped:
            return None
        self.record["note"] = "measured in the background while serving on the first ready"
        with self._lock:
            self._owned.extend(h for h in chosen if h not in self.foreground)
        return chosen

    def _switch(self, lineup: ServingLineup, chosen: Sequence[Held], word: str,
                measured_at: str | None) -> None:
        changed = [(old, new) for old, new in zip(self.foreground, chosen, strict=True)
                   if old is not new]
        for stage in self.config.stages:
            self._decided[stage.id] = word
        if not changed:
            self._step("the serving candidates are the chosen ones: no switch")
            return
        slots = [slot for held in chosen for slot in held.slots]
        old = lineup.current
        fresh = Serving(slots, self.decisions(), number=old.number + 1, measured_at=measured_at)
        with self._lock:
            previous = lineup.switch(fresh)
            self._owned = [h for h in self._owned if h not in chosen]
            leaving = [s for o, _ in changed for s in o.slots]
            self._old.extend(leaving)
            self.foreground = list(chosen)
        for held_old, held_new in changed:
            event = {"at": _now(), "stage": held_old.stage_id,
                     "from": candidate_label(held_old), "to": candidate_label(held_new),
                     "placement": fresh.number, "decision": word}
            self.record["switches"].append(event)
            self.opener.say(f"first-ready: stage {held_old.stage_id} switched from "
                            f"{event['from']} to {event['to']} ({word})")
        while not lineup.wait_idle(previous, 0.5):
            if self._stopping.is_set():
                return  # close retires them (finishing())
        if any(s.runtime is not None and s.runtime.made_input_buffers for s in leaving):
            # a caller may still hold arrays in its shared memory: kept until close
            self._step("the switched-out first stage holds input buffers: kept until close")
            return
        with self._lock:
            self._old = [s for s in self._old if s not in leaving]
        self.opener.retire(leaving)
        self._step(f"retired the switched-out candidates of "
                   f"{', '.join(sorted({h.stage_id for h, _ in changed}))}")

    def _release_owned(self) -> None:
        """Retire every candidate the background holds and does not serve.

        Each leaves :attr:`_owned` only once it is retired: an interruption (Ctrl-C,
        SIGTERM, or a ``KeyboardInterrupt`` on this thread) as one retires lets it and
        every other one still held be retired before it is raised (retiring is
        idempotent: a slot already settled is not retired again). Before, the list was
        taken and emptied first: one that came before they retired left them running,
        their reservations charged, and no later call found them.
        """
        try:
            self._retire_owned()
        except BaseException:
            self._retire_owned()  # the one it came in, and the rest
            raise

    def _retire_owned(self) -> None:
        while True:
            with self._lock:
                if not self._owned:
                    return
                held = self._owned[0]
            slots = [slot for slot in held.slots if not slot.settled
                     and (slot.runtime is not None or slot.token is not None)]
            if slots:
                self.opener.retire(slots)
            with self._lock:
                if self._owned and self._owned[0] is held:
                    del self._owned[0]

    def stop(self) -> None:
        """End the background work (it stops between steps) and retire what it held."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
        self._release_owned()

    def finishing(self) -> list[StageSlot]:
        """Switched-out slots not yet retired."""
        with self._lock:
            return list(self._old)

    def plan_record(self) -> dict[str, Any]:
        """The plan's ``selection`` section now (the background's progress included)."""
        with self._lock:
            record = dict(self.record)
            record["switches"] = [dict(e) for e in self.record["switches"]]
            background = self.record.get("background")
            if isinstance(background, dict):
                record["background"] = {**background,
                                        "steps": [dict(s) for s in background["steps"]]}
            return record


def _open_first(opener: StageOpener, index: int, stage: Any, order: list[int]) -> Held:
    """The first candidate of ``stage`` in ``order`` that passes; every try recorded."""
    tries: dict[int, dict[str, Any]] = {}
    for number in order:
        choice = stage.choices()[number]
        try:
            held = open_held(opener, index, number, choice,
                             candidate_path(index, stage, number), tag=False)
        except Exception as error:
            if not stage.candidates:
                raise
            tries[number] = refusal_entry(choice.backend.name, error)
            opener.say(f"stage {stage.id}: candidate {choice.backend.name} refused at "
                       f"{tries[number]['layer']}")
            continue
        tries[number] = {"backend": held.backend, "outcome": CHOSEN, "layer": None,
                         "reason": "the first ready: serving while the others are chosen",
                         "open_s": held.open_s, "provider": held.provider(),
                         "gate": held.gate()}
        opener.tried[stage.id] = [{"candidate": n, **tries[n]} for n in sorted(tries)]
        return held
    listed = [{"candidate": n, **tries[n]} for n in sorted(tries)]
    opener.tried[stage.id] = listed
    raise CandidatesRefused(stage.id, listed)
