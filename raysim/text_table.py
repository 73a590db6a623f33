"""One plain-text table printer for the CLI's tables (report, tune, partition counts).

Columns are two spaces apart under a dashed rule; a column of numbers is right-aligned, any other
column left-aligned; trailing blanks are cut.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

# A cell that reads as a number: 12, -0.5, 1e-3, 3/5 (rounds), 0.41 +- 0.02 (mean +- std), >10 (1/2).
_NUMBER = re.compile(r"[<>]?[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?%?")
_NUMERIC = re.compile(rf"{_NUMBER.pattern}((\s*(\+-|/)\s*|\s+\(){_NUMBER.pattern}\)?)*")
# Cells that say "no value" and do not decide a column's alignment.
_BLANK = {"", "-", "None", "nan"}


def is_number(cell: str) -> bool:
    return _NUMERIC.fullmatch(cell.strip()) is not None


def text_table(
    header: Sequence[Any],
    rows: Sequence[Sequence[Any]],
    *,
    footer: Sequence[Sequence[Any]] = (),
    align: str | None = None,
) -> str:
    """`rows` under `header`, then `footer` (e.g. a totals row) under a second rule.

    Cells are printed with str(). `align` gives one letter per column, "l" or "r"; by default a
    column is right-aligned when every cell of it in `rows` and `footer` that holds a value reads
    as a number, else left-aligned. The header cell is aligned like its column.
    """
    cells = [[str(c) for c in row] for row in [header, *rows, *footer]]
    n = len(cells[0])
    if any(len(row) != n for row in cells):
        raise ValueError(f"every row needs {n} cells, like the header")
    if align is None:
        body = cells[1:]
        align = "".join(
            "r"
            if any(r[j].strip() not in _BLANK for r in body)
            and all(r[j].strip() in _BLANK or is_number(r[j]) for r in body)
            else "l"
            for j in range(n)
        )
    elif len(align) != n or set(align) - {"l", "r"}:
        raise ValueError(f"align needs one 'l' or 'r' per column ({n}), got {align!r}")
    widths = [max(len(r[j]) for r in cells) for j in range(n)]

    def line(row: list[str]) -> str:
        return "  ".join(c.rjust(w) if a == "r" else c.ljust(w) for c, w, a in zip(row, widths, align)).rstrip()

    rule = "  ".join("-" * w for w in widths)
    lines = [line(cells[0]), rule, *(line(r) for r in cells[1 : len(rows) + 1])]
    if footer:
        lines += [rule, *(line(r) for r in cells[len(rows) + 1 :])]
    return "\n".join(lines)
