"""metrics.parquet: one row per (round, client or server, metric).

`client` is null for server metrics; the server's test metrics are `accuracy`
and `loss`. The table is rewritten (atomically) after every round, so a run
that dies keeps every finished round.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from raysim.outputs.files import atomic_write

SCHEMA = pa.schema([("round", pa.int64()), ("client", pa.int64()), ("metric", pa.string()), ("value", pa.float64())])

Row = tuple[int, int | None, str, float]


def is_timing(metric: str) -> bool:
    """Wall-clock metrics (the server's `time_*_s` and `round_time_s`, the clients' `time_*`): the only
    values that differ between two runs of one config."""
    return metric.startswith("time") or metric == "round_time_s"


class MetricsTable:
    def __init__(self, path: Path, resume_through_round: int | None = None):
        self.path = path
        self.rows: list[Row] = []
        if resume_through_round is not None and path.exists():
            table = pq.read_table(path).to_pylist()
            self.rows = [
                (r["round"], r["client"], r["metric"], r["value"]) for r in table if r["round"] <= resume_through_round
            ]

    def add(self, round_index: int, client: int | None, metric: str, value: float) -> None:
        self.rows.append((round_index, client, metric, float(value)))

    def server_values(self, metric: str) -> list[tuple[int, float]]:
        return [(r, v) for r, c, m, v in self.rows if c is None and m == metric]

    def flush(self) -> None:
        columns = list(zip(*self.rows)) if self.rows else [[], [], [], []]
        table = pa.table({name: list(col) for name, col in zip(SCHEMA.names, columns)}, schema=SCHEMA)
        atomic_write(self.path, lambda p: pq.write_table(table, p))
