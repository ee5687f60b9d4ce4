"""The device x model matrix: the latest record of every cell, counts per status.

Rows are models; columns are (device, configuration) pairs. When several records name
the same cell, the newest (by ``created_at``) is shown and the others are counted as
superseded, never silently merged.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from edge_core.evidence.records import QualificationRecord
from edge_core.evidence.status import Status

__all__ = ["Matrix", "MatrixEntry", "build_matrix"]


@attrs.frozen
class MatrixEntry:
    """One cell as shown: its newest record, the link to it, how many older ones exist."""

    record: QualificationRecord
    href: str
    superseded: tuple[str, ...] = ()


@attrs.frozen
class Matrix:
    """Rows (models), columns (device, configuration) and the entry of every filled cell."""

    models: tuple[str, ...]
    columns: tuple[tuple[str, str], ...]
    entries: dict[tuple[str, str, str], MatrixEntry]

    def entry(self, model: str, column: tuple[str, str]) -> MatrixEntry | None:
        """The entry at (model, column), if any record names that cell."""
        return self.entries.get((model, column[0], column[1]))

    @property
    def counts(self) -> dict[Status, int]:
        """Cells per status (every status listed, zero included), in declaration order."""
        counts = dict.fromkeys(Status, 0)
        for entry in self.entries.values():
            counts[entry.record.status] += 1
        return counts


def build_matrix(records: Sequence[tuple[QualificationRecord, str]]) -> Matrix:
    """Aggregate ``(record, href)`` pairs; the newest record of a cell wins."""
    entries: dict[tuple[str, str, str], MatrixEntry] = {}
    ordered = sorted(records, key=lambda pair: pair[0].created_at)
    for record, href in ordered:
        cell = record.cell
        key = (cell.model, cell.device, cell.configuration)
        previous = entries.get(key)
        older = (*previous.superseded, previous.href) if previous is not None else ()
        entries[key] = MatrixEntry(record, href, older)
    models = tuple(sorted({key[0] for key in entries}))
    columns = tuple(sorted({(key[1], key[2]) for key in entries}))
    return Matrix(models, columns, entries)
