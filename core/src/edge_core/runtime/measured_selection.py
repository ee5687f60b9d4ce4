"""Measured selection: every candidate that passes its gates is timed inside the whole chain.

``selection = "measured"`` (the default) opens a pipeline whose stages list candidates
through :class:`MeasuredOpen`, a policy over the
:class:`~edge_core.runtime.opener.StageOpener`:

1. **Open.** Stage by stage in data-flow order, every candidate goes through probe →
   reserve → load → warm-up placement gate → numerics → memory, as a first-passing open
   does; each one that passes stays open. Two candidates of one stage are held at once
   only when the ledger admits both (each under its own owner, ``pipeline/stage~c``); a
   candidate that does not fit beside those already open is *deferred*: it is opened
   once the stage's race is run and its losers are retired, and raced against the
   winner. A stage whose candidates are all refused raises ``CandidatesRefused``.
2. **Race.** On one workload (:mod:`edge_core.selection.workload`), each placement is
   timed through the whole chain — transfers and copies included — the stages without
   a choice held fixed. Few combinations (``measurement.joint_limit``) are raced jointly;
   more are raced greedily, stage by stage in data-flow order
   (:mod:`edge_core.selection.combinations`). A race stops a candidate once it is
   clearly worse, each race has ``measurement.budget_s``, and a tie within the margin
   keeps the earlier-listed candidate (:mod:`edge_core.selection.racing`).
3. **Judge the split.** When the winning placement uses more backends than the
   fewest-backend placement, both are timed again one request at a time, the split also
   with requests overlapped (``max(2, admission)`` in flight), and the split is kept
   only if it beats the fewest-backend placement by more than
   ``measurement.split_margin``; otherwise the fewest-backend placement serves and the
   plan says why, with the numbers.
4. **Keep.** Every candidate that does not serve is retired (verified) and its
   reservation released; the decision, with each candidate's gate results and figures,
   is stored (:mod:`edge_core.selection.store`) and reused by the next open with the same
   key (:mod:`edge_core.selection.key`) without measuring — only the chosen candidates
   are opened then.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from edge_core.errors import EdgeError, ResourceUnavailable
from edge_core.runtime.candidate_entries import (
    CHOSEN,
    CandidatesRefused,
    candidate_path,
    refusal_entry,
)
from edge_core.runtime.linear_chain import check_linear_chain
from edge_core.runtime.opener import StageOpener
from edge_core.runtime.placement_timing import (
    Held,
    Lineup,
    RaceRun,
    candidate_label,
    open_held,
    race_settings,
    run_race,
    time_overlapped,
)
from edge_core.runtime.stage_slot import StageSlot
from edge_core.selection.combinations import (
    Figures,
    backends_of,
    fewest_backends,
    greedy_entrants,
    joint_entrants,
    judge_split,
    plan_schedule,
)
from edge_core.selection.key import DecisionKey, content_parts
from edge_core.selection.store import DecisionStore, Lookup, StoredDecision
from edge_core.selection.workload import Workload, examples_workload

__all__ = ["PASSED", "MeasuredOpen", "MeasurementStopped", "open_decided",
           "selection_record"]

PASSED = "passed"
"""The outcome of a candidate that passed every gate but does not serve."""

DEFERRED = "deferred"


class MeasurementStopped(EdgeError):
    """The measurement was stopped before it decided (the pipeline is closing)."""


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def selection_record(config: Any, decision: str, note: str) -> dict[str, Any]:
    """The plan's ``selection`` section, before anything was measured."""
    return {"selection": config.selection, "objective": config.objective,
            "start": config.start, "decision": decision, "note": note,
            "measured_at": None, "key": None, "changed": [], "warning": None,
            "workload": None, "schedule": None, "races": [], "split": None, "alone": [],
            "switches": [], "background": None}


def open_decided(opener: StageOpener, decision: Mapping[str, Any]) -> list[Held]:
    """Open every stage on the candidate ``decision`` names (a stored decision), in order.

    Raises:
        Whatever opening a decided candidate raised, after retiring what was opened.
    """
    config = opener.config
    held: list[Held] = []
    try:
        for index, stage in enumerate(config.stages):
            number = int(decision["stages"][stage.id]["choice"])
            choice = stage.choices()[number]
            held.append(open_held(opener, index, number, choice,
                                  candidate_path(index, stage, number), tag=False))
    except BaseException:
        opener.retire([slot for h in held for slot in h.slots])
        raise
    return held


class MeasuredOpen:
    """One measured open of a pipeline; see the module's docstring.

    Args:
        opener: The opener (its ``tried`` gets each stage's candidate entries).
        workload: What is timed (``None``: the first stage's bundled examples).
        store: Where decisions are kept (``None``: neither read nor written).
        key: The decision's key (``None``: not stored).
        remeasure: Measure even when a stored decision matches.
        seed: Candidates already open and serving (first-ready), one per stage at most.
        stop: Asked between samples; true ends the measurement early (closing).

    Attributes:
        record: The plan's ``selection`` section.
        decision: What was decided, as stored.
    """

    def __init__(self, opener: StageOpener, workload: Workload | None, *,
                 store: DecisionStore | None = None, key: DecisionKey | None = None,
                 remeasure: bool = False, seed: Sequence[Held] = (),
                 stop: Callable[[], bool] | None = None) -> None:
        self.opener = opener
        self.seed = {h.index: h for h in seed}
        """Stage index → a candidate already open and serving (a first-ready start's): it
        is raced like the others but never retired here."""
        self.stop = stop
        self.config = opener.config
        self.workload = workload
        self.store = store
        self.key = key
        self.remeasure = remeasure
        self.record = selection_record(self.config, "measured", "")
        self.decision: dict[str, Any] = {}
        self.passing: list[list[Held]] = []
        self.entries: list[dict[int, dict[str, Any]]] = []
        self.deferred: list[list[int]] = []
        self.races: list[tuple[tuple[int, ...], RaceRun, list[list[Held]]]] = []
        self.chosen: list[int] = []
        self.dropped: list[Held] = []
        """Candidates that passed and were retired before the end (a deferred round's)."""
        self.alone: list[dict[str, Any]] = []
        """Deferred candidates measured in the winner's place (the ledger was too tight)."""

    # -- the whole open -----------------------------------------------------------------

    def open(self) -> list[StageSlot]:
        """Open, measure and decide; the chosen candidates' slots, in data-flow order.

        Raises:
            TopologyRefused: the stages are not a linear chain (nothing reserved).
            CandidatesRefused: some stage had no candidate pass (everything retired).
            A stage's own error, unchanged, when it lists no candidates.
        """
        check_linear_chain(self.config)
        stored = self._lookup()
        if stored is not None:
            try:
                return self._reuse(stored)
            except Exception as error:  # the world changed under the key: measure
                self.record["note"] = (f"the stored decision's candidates could not all be "
                                       f"opened now ({type(error).__name__}: {error}); "
                                       f"measured again")
                self.opener.tried.clear()
        try:
            chosen = self.measure()
        except BaseException as error:
            if isinstance(error, CandidatesRefused):
                error.tried = {sid: [dict(t) for t in tries]
                               for sid, tries in self.opener.tried.items()}
            raise
        return [slot for held in chosen for slot in held.slots]

    def _lookup(self) -> StoredDecision | None:
        if self.store is None or self.key is None:
            self.record["note"] = "measured (decisions are not stored)"
            return None
        self.record["key"] = self.key.digest
        if self.remeasure:
            self.record["note"] = "measured: a new measurement was asked for (--remeasure)"
            return None
        if not self.config.measurement.reuse:
            self.record["note"] = "measured: measurement.reuse is false"
            return None
        lookup: Lookup = self.store.load(self.key, self.config)
        self.record["warning"] = lookup.warning
        if lookup.found is not None:
            return lookup.found
        changed = lookup.changed(self.key)
        if lookup.warning is not None:
            self.record["note"] = "measured: the stored decision could not be used"
        elif changed:
            self.record["changed"] = changed
            self.record["note"] = (f"re-measured: {', '.join(changed)} changed since the "
                                   f"decision of {lookup.previous.measured_at}"
                                   if lookup.previous is not None else "measured")
        else:
            self.record["note"] = "measured: no stored decision for this pipeline"
        return None

    def _reuse(self, stored: StoredDecision) -> list[StageSlot]:
        held = open_decided(self.opener, stored.decision)
        saved = stored.decision.get("record") or {}
        for key in ("workload", "schedule", "races", "split"):
            self.record[key] = saved.get(key)
        self.record.update(decision="reused", measured_at=stored.measured_at,
                           note=f"measured on {stored.measured_at}, reused")
        for index, stage in enumerate(self.config.stages):
            entries = [dict(e) for e in stored.decision["stages"][stage.id].get("entries", [])]
            opened = held[index]
            for entry in entries:
                entry["reused"] = True
                if entry.get("candidate") == opened.number:
                    entry["open_s"] = opened.open_s
                    entry["gate"] = opened.gate()
            self.opener.tried[stage.id] = entries or [
                {"candidate": opened.number, "backend": opened.backend, "outcome": CHOSEN,
                 "layer": None, "reason": None}]
        self.decision = dict(stored.decision)
        self.passing = [[h] for h in held]
        self.chosen = [0] * len(held)
        return [slot for h in held for slot in h.slots]

    # -- measuring ------------------------------------------------------------------------

    def measure(self) -> list[Held]:
        """Open every candidate, race, judge the split, keep the decision; the chosen.

        Every held candidate that is not chosen is retired, except the seeded ones
        (serving: their owner retires them once no request holds them).

        Raises:
            MeasurementStopped: ``stop()`` became true (nothing is stored).
            CandidatesRefused / a stage's own error, as :meth:`open`.
            In every case, everything this measurement opened is retired first.
        """
        try:
            return self._measure()
        except BaseException:
            self._retire(lambda h: True)
            raise

    def _check_stop(self) -> None:
        if self.stop is not None and self.stop():
            raise MeasurementStopped(f"pipelines[{self.config.name}]: closing")

    def _measure(self) -> list[Held]:
        for index in range(len(self.config.stages)):
            self._check_stop()
            self._open_stage(index)
        workload = self.workload or self._examples()
        self.record["workload"] = workload.to_json() if workload is not None else None
        counts = [len(p) for p in self.passing]
        schedule = plan_schedule(counts, self.config.measurement.joint_limit)
        self.record["schedule"] = {"mode": schedule.mode, "combinations": schedule.combinations,
                                   "stages": [self.config.stages[i].id for i in schedule.stages],
                                   "note": schedule.describe()}
        self.chosen = [0] * len(counts)
        if schedule.mode != "none" and workload is None:
            self.record["decision"] = "not-measured"
            self.record["note"] = ("not measured: no workload, no --input and no bundled "
                                   "example inputs to time; the first passing candidates "
                                   "serve")
        elif workload is not None and schedule.mode == "joint":
            run = self._race(joint_entrants(counts), list(schedule.stages), workload)
            self.chosen = list(run.placements[run.result.chosen])
        elif workload is not None and schedule.mode == "greedy":
            for index in schedule.stages:
                run = self._race(greedy_entrants(counts, index, self.chosen), [index], workload)
                self.chosen = list(run.placements[run.result.chosen])
        self._check_stop()
        if workload is not None:
            self._deferred_rounds(workload)
            self._judge_split(workload)
        self._check_stop()
        chosen = [self.passing[index][c] for index, c in enumerate(self.chosen)]
        self._retire(lambda h: h not in chosen)
        self._entries()
        self.record["alone"] = list(self.alone)
        self.record["measured_at"] = _now()
        self._keep()
        return chosen

    def _open_stage(self, index: int) -> None:
        stage = self.config.stages[index]
        seeded = self.seed.get(index)
        held: list[Held] = [seeded] if seeded is not None else []
        entries: dict[int, dict[str, Any]] = {}
        deferred: list[int] = []
        for number, choice in enumerate(stage.choices()):
            if seeded is not None and number == seeded.number:
                continue
            try:
                held.append(open_held(self.opener, index, number, choice,
                                      candidate_path(index, stage, number), tag=bool(held)))
            except Exception as error:
                if not stage.candidates:
                    raise
                if isinstance(error, ResourceUnavailable) and held:
                    deferred.append(number)
                    entries[number] = {**refusal_entry(choice.backend.name, error),
                                       "outcome": DEFERRED}
                    self.opener.say(f"stage {stage.id}: candidate {choice.backend.name} "
                                    f"does not fit beside the others: measured later")
                    continue
                entries[number] = refusal_entry(choice.backend.name, error)
                self.opener.say(f"stage {stage.id}: candidate {choice.backend.name} refused "
                                f"at {entries[number]['layer']}")
        held.sort(key=lambda h: h.number)
        self.passing.append(held)
        self.entries.append(entries)
        self.deferred.append(deferred)
        # until the choice is made (or when a later stage has no candidate and nothing is
        # measured): the first that passed stands chosen, as first-passing would have it
        found = {**entries, **{h.number: {
            "backend": h.backend, "outcome": CHOSEN if k == 0 else PASSED, "layer": None,
            "reason": None if k == 0 else "passed every gate; not measured"}
            for k, h in enumerate(held)}}
        tries = [{"candidate": n, **found[n]} for n in sorted(found)]
        self.opener.tried[stage.id] = tries
        if not held:
            raise CandidatesRefused(stage.id, tries)

    def _examples(self) -> Workload | None:
        first = self.passing[0][0].slots[0]
        runtime = first.runtime
        bundle = getattr(runtime.loaded, "bundle", None) if runtime is not None else None
        found = None if bundle is None else first.example_inputs()  # as it loaded them
        if found is None:
            return None
        return examples_workload(first.context.stage_id, found.arrays, found.member)

    def _lineup(self, placement: Sequence[int]) -> Lineup:
        return Lineup([self.passing[i][c] for i, c in enumerate(placement)])

    def _names(self, placement: tuple[int, ...]) -> dict[str, int]:
        return {self.config.stages[i].id: self.passing[i][c].number
                for i, c in enumerate(placement)}

    def _race(self, placements: list[tuple[int, ...]], varying: list[int],
              workload: Workload, *, margin: float | None = None) -> RaceRun:
        lineups = [self._lineup(p) for p in placements]
        labels = [lineup.label(varying) for lineup in lineups]
        shown = " | ".join(labels)
        self.opener.say(f"measuring {shown} on {workload.note}")
        run = run_race(lineups, placements, labels,
                       race_settings(self.config.measurement, self.config.objective,
                                     margin=margin),
                       workload.inputs, where=f"pipelines[{self.config.name}].measurement",
                       warmup_calls=self.config.measurement.warmup_calls,
                       concurrency=self.config.admission, say=self.opener.say,
                       params=workload.params, stop=self.stop)
        self.races.append((tuple(varying), run, [lineup.held for lineup in lineups]))
        self.record["races"].append({
            "stages": [self.config.stages[i].id for i in varying],
            **run.to_json(self._names)})
        self.opener.say(f"chose {run.result.reason}")
        return run

    def _deferred_rounds(self, workload: Workload) -> None:
        """Measure each deferred candidate after retiring its stage's losers.

        It is raced against the stage's winner when the ledger admits both; otherwise it
        is measured alone in the winner's place (the winner retired, and opened again if
        it stays the better one), the two compared on their p50s.
        """
        for index, numbers in enumerate(self.deferred):
            if not numbers:
                continue
            winner = self.passing[index][self.chosen[index]]
            self._retire_losers(index, winner)
            self.passing[index] = [winner]
            self.chosen[index] = 0
            for number in numbers:
                self._deferred(index, number, workload)

    def _deferred(self, index: int, number: int, workload: Workload) -> None:
        stage = self.config.stages[index]
        choice = stage.choices()[number]
        path = candidate_path(index, stage, number)
        winner = self.passing[index][0]
        try:
            opened = open_held(self.opener, index, number, choice, path, tag=True)
        except ResourceUnavailable as error:
            if id(winner) in set(map(id, self.seed.values())):  # serving: it stays
                self.entries[index][number] = {
                    **refusal_entry(choice.backend.name, error),
                    "reason": f"ResourceUnavailable: {error} (did not fit beside the "
                              "serving candidate)"}
                return
            self._alone(index, number, workload)
            return
        except Exception as error:
            self.entries[index][number] = refusal_entry(choice.backend.name, error)
            return
        self.entries[index].pop(number, None)
        contenders = sorted([winner, opened], key=lambda h: h.number)
        self.passing[index] = contenders
        placements = [tuple([*self.chosen[:index], k, *self.chosen[index + 1:]])
                      for k in range(len(contenders))]
        run = self._race(placements, [index], workload)
        best = contenders[run.placements[run.result.chosen][index]]
        self.dropped.extend(h for h in contenders if h is not best)
        self._retire_losers(index, best)
        self.passing[index] = [best]

    def _alone(self, index: int, number: int, workload: Workload) -> None:
        """Measure candidate ``number`` in the place of the stage's winner, one at a time."""
        stage = self.config.stages[index]
        winner = self.passing[index][0]
        before = self._figure(index, winner)
        if before is None:  # never raced (it was alone): timed now, while it is open
            before = self._race([tuple(self.chosen)], [index], workload).result.entrants[0]
        self.opener.say(f"stage {stage.id}: measuring {stage.choices()[number].backend.name}"
                        f"[{number}] alone: the ledger does not admit it beside "
                        f"{candidate_label(winner)}")
        self._retire_losers(index, None)
        try:
            opened = open_held(self.opener, index, number, stage.choices()[number],
                               candidate_path(index, stage, number), tag=False)
        except Exception as error:
            self.entries[index][number] = refusal_entry(stage.choices()[number].backend.name,
                                                        error)
            self.passing[index] = [self._reopen(winner)]
            return
        self.entries[index].pop(number, None)
        self.passing[index] = [opened]
        run = self._race([tuple(self.chosen)], [index], workload)
        mine = run.result.entrants[0].get("p50_s")
        theirs = before.get("p50_s") if before is not None else None
        margin = self.config.measurement.margin
        if mine is None or (theirs is not None and not (
                mine < theirs * (1.0 - margin) if number > winner.number
                else mine <= theirs * (1.0 + margin))):
            self.dropped.append(opened)
            self._retire_losers(index, None)
            self.passing[index] = [self._reopen(winner)]
            note = "measured alone (the ledger does not admit it beside the winner): slower"
        else:
            self.dropped.append(winner)
            note = "measured alone (the ledger does not admit it beside the winner): faster"
        self.alone.append({"stage": stage.id, "candidate": number, "note": note,
                           "p50_s": mine, "against_p50_s": theirs})

    def _reopen(self, held: Held) -> Held:
        stage = self.config.stages[held.index]
        return open_held(self.opener, held.index, held.number, stage.choices()[held.number],
                         candidate_path(held.index, stage, held.number), tag=False)

    def _judge_split(self, workload: Workload) -> None:
        names = [[h.backend for h in held] for held in self.passing]
        fewest = list(fewest_backends(names))
        split = backends_of(names, self.chosen)
        if len(split) <= len(backends_of(names, fewest)):
            return
        measurement = self.config.measurement
        placements = [tuple(fewest), tuple(self.chosen)]  # fewest first: a tie keeps it
        run = self._race(placements, list(range(len(self.chosen))), workload,
                         margin=measurement.split_margin)
        entrants = run.result.entrants
        concurrency = max(2, self.config.admission)
        requests = 2 * concurrency
        overlapped: dict[str, float | None] = {}
        for name, placement in (("split", self.chosen), ("single", fewest)):
            try:
                overlapped[name] = time_overlapped(
                    self._lineup(placement), list(workload.inputs),
                    f"pipelines[{self.config.name}].measurement", concurrency, requests,
                    workload.params)
            except Exception as error:  # the serial figures still judge
                overlapped[name] = None
                self.opener.say(f"overlapped measurement failed: {error}")
        single_s, split_s = entrants[0]["p50_s"], entrants[1]["p50_s"]
        memory = [self._lineup(p).memory_bytes for p in placements]
        throughput = self.config.objective == "throughput"
        single_cost = overlapped["single"] if throughput else single_s
        split_cost = overlapped["split"] if throughput else split_s
        if single_cost is None or split_cost is None:
            verdict = None
            keep = split_cost is not None and single_cost is None
            reason = "one placement could not be measured: the one that could serves"
        else:
            verdict = judge_split(self.config.objective,
                                  Figures(cost_s=split_cost, memory_bytes=memory[1],
                                          latency_s=split_s),
                                  Figures(cost_s=single_cost, memory_bytes=memory[0],
                                          latency_s=single_s),
                                  measurement.split_margin, measurement.latency_bound_s)
            keep, reason = verdict.keep, verdict.reason
        self.record["split"] = {
            "backends": split, "fewest_backends": backends_of(names, fewest),
            "split_placement": self._names(tuple(self.chosen)),
            "single_placement": self._names(tuple(fewest)),
            "single_serial_p50_s": single_s, "split_serial_p50_s": split_s,
            "split_overlapped_s_per_request": overlapped["split"],
            "single_overlapped_s_per_request": overlapped["single"],
            "overlapped_in_flight": concurrency, "margin": measurement.split_margin,
            "kept": keep, "gain": verdict.gain if verdict is not None else None,
            "reason": reason,
            "serving": "split" if keep else "fewest-backends"}
        self.opener.say(f"split across {', '.join(split)}: {reason}")
        if not keep:
            self.chosen = fewest

    # -- records and keeping --------------------------------------------------------------

    def _retire(self, which: Callable[[Held], bool]) -> None:
        """Retire every held candidate ``which`` selects (verified), settling each.

        A seeded candidate (serving) is never retired here, nor is a slot already retired
        and settled: retiring is idempotent. So a Ctrl-C as the losers retire (the
        retirement it came in runs to its end, then :meth:`measure` retires everything
        else) retires each loser once, and its ``release_outcome`` stays ``released``.
        Before, the losers were retired a second time, and that second settle recorded
        ``none``.
        """
        seeded = set(map(id, self.seed.values()))
        doomed = [h for held in self.passing for h in held if which(h) and h.slots
                  and id(h) not in seeded and h.slots[0].runtime is not None]
        slots = [slot for h in doomed for slot in h.slots if not slot.settled]
        if slots:
            self.opener.retire(slots)

    def _retire_losers(self, index: int, winner: Held | None) -> None:
        """Retire stage ``index``'s held candidates other than ``winner`` (None: all)."""
        self._retire(lambda h: h.index == index and h is not winner)

    def _figure(self, index: int, held: Held) -> dict[str, Any] | None:
        """The candidate's figures from the last race that timed it beside the chosen."""
        chosen = [self.passing[i][c] for i, c in enumerate(self.chosen)]
        found: dict[str, Any] | None = None
        for varying, run, lineups in self.races:
            if index not in varying:
                continue
            entrants = run.result.to_json()["entrants"]
            for number, lineup in enumerate(lineups):  # candidates by number: reopened
                same_rest = all(h.number == chosen[i].number or i == index  # ones count
                                for i, h in enumerate(lineup))
                if same_rest and lineup[index].number == held.number:
                    found = {**entrants[number], "placement": {
                        h.stage_id: h.number for h in lineup}}
        return found

    def _entries(self) -> None:
        for index, stage in enumerate(self.config.stages):
            entries = dict(self.entries[index])
            chosen = self.passing[index][self.chosen[index]]
            passed = {h.number: h for h in self.dropped if h.index == index}
            passed.update({h.number: h for h in self.passing[index]})
            for held in passed.values():
                measured = self._figure(index, held)
                entry: dict[str, Any] = {
                    "backend": held.backend,
                    "outcome": CHOSEN if held.number == chosen.number else PASSED,
                    "layer": None, "reason": None, "open_s": held.open_s,
                    "provider": held.provider(), "gate": held.gate(), "measured": measured}
                if held.number != chosen.number:
                    entry["reason"] = self._why_not(held, chosen, measured)
                entries[held.number] = entry
            for number, entry in entries.items():
                if entry.get("outcome") == DEFERRED:
                    entries[number] = {**entry, "outcome": "refused",
                                       "reason": f"{entry['reason']} (did not fit beside the "
                                                 "stage's other candidates)"}
            self.opener.tried[stage.id] = [{"candidate": n, **entries[n]}
                                           for n in sorted(entries)]

    def _why_not(self, held: Held, chosen: Held, measured: Mapping[str, Any] | None) -> str:
        split = self.record.get("split")
        if split is not None and split["serving"] == "fewest-backends" \
                and held.number == split["split_placement"].get(held.stage_id):
            return f"passed every gate; not chosen: {split['reason']}"
        if measured is None:
            return "passed every gate; not measured (the budget ran out first)"
        stopped = {"race": "stopped by the race", "budget": "stopped: the budget ran out",
                   "max-samples": "at the sample limit", "bound": "bound decided",
                   "failed": "a timed request failed", None: "raced to the end"}
        relative = measured.get("relative")
        if self.config.objective == "memory":
            how = (f"reserves {relative:+.1%} memory" if relative is not None
                   else "reserves more memory")
        elif relative is None:
            how = "slower"
        elif relative <= self.config.measurement.margin:
            how = (f"a tie within {self.config.measurement.margin:.0%} "
                   f"({relative:+.1%}): the earlier-listed {candidate_label(chosen)} serves")
        else:
            how = f"{relative:+.1%} p50 against {candidate_label(chosen)}"
        samples = measured.get("samples", 0)
        return (f"passed every gate; not chosen: {how} ({stopped.get(measured.get('stopped'))}"
                f" after {samples} sample{'s' if samples != 1 else ''})")

    def _keep(self) -> None:
        stages = {stage.id: {"choice": self.passing[index][self.chosen[index]].number,
                             "backend": self.passing[index][self.chosen[index]].backend,
                             "entries": self.opener.tried.get(stage.id, [])}
                  for index, stage in enumerate(self.config.stages)}
        self.decision = {"stages": stages, "record": {
            key: self.record.get(key) for key in ("workload", "schedule", "races", "split",
                                                  "objective", "measured_at")}}
        if self.record["decision"] != "measured" or self.store is None or self.key is None:
            return
        sources = self.workload.sources if self.workload is not None else ()
        now = content_parts(self.config, sources)
        moved = [part for part, digest in now.items() if self.key.parts.get(part) != digest]
        if moved:
            self.record["warning"] = (f"the decision was not stored: {', '.join(moved)} "
                                      "changed while it was measured")
            return
        try:
            self.store.save(self.key, self.config, self.decision)
        except OSError as error:
            self.record["warning"] = f"the decision could not be stored: {error}"
