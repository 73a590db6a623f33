"""metrics.parquet: one row per (round, client or server, metric).

`client` is null for server metrics; the server's test metrics are `accuracy`
and `loss`. The table is rewritten (atomically) after every round, so a run
that dies keeps every finished round.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from raysim.errors import RaysimError
from raysim.outputs.safe_write import atomic_write

SCHEMA = pa.schema([("round", pa.int64()), ("client", pa.int64()), ("metric", pa.string()), ("value", pa.float64())])

Row = tuple[int, int | None, str, float]

# Each phase of a round: the server's row of its wall time, and (with eval.count_macs) the metric of
# its multiply-accumulates: the clients' on each client's row, the server's phases on the server's.
PHASE_SECONDS = {
    "broadcast": "time_broadcast_s",
    "clients": "time_clients_s",
    "server": "time_server_update_s",
    "eval": "time_eval_s",
}
PHASE_MACS = {"clients": "macs", "server": "macs_server", "eval": "macs_eval"}


def phase_macs(rows: list[Row]) -> dict[str, float | None]:
    """Each counted phase's multiply-accumulates over `rows` (the clients' summed over clients and
    rounds), None where none was logged (the run did not count)."""
    out = {}
    for phase, metric in PHASE_MACS.items():
        from_clients = phase == "clients"
        values = [v for _, client, m, v in rows if m == metric and (client is not None) == from_clients]
        out[phase] = float(sum(values)) if values else None
    return out


def is_timing(metric: str) -> bool:
    """Wall-clock metrics (the server's `time_*_s` and `round_time_s`, the clients' `time_*`): the only
    values that differ between two runs of one config."""
    return metric.startswith("time") or metric == "round_time_s"


class MetricsTable:
    def __init__(self, path: Path, resume_through_round: int | None = None):
        self.path = path
        self.rows: list[Row] = []
        if resume_through_round:  # a resume: the finished rounds' records must all be there
            self.rows = [r for r in read_rows(path) if r[0] <= resume_through_round]
            last = max((r[0] for r in self.rows), default=0)
            if last < resume_through_round:
                raise RaysimError(
                    f"{path} ends at round {last} but the checkpoint is at round {resume_through_round}: "
                    "the summary would leave rounds out, so this run cannot be resumed; start a fresh run"
                )

    def add(self, round_index: int, client: int | None, metric: str, value: float) -> None:
        self.rows.append((round_index, client, metric, float(value)))

    def server_values(self, metric: str) -> list[tuple[int, float]]:
        return [(r, v) for r, c, m, v in self.rows if c is None and m == metric]

    def flush(self) -> None:
        columns = list(zip(*self.rows)) if self.rows else [[], [], [], []]
        table = pa.table({name: list(col) for name, col in zip(SCHEMA.names, columns)}, schema=SCHEMA)
        atomic_write(self.path, lambda p: pq.write_table(table, p))


def read_rows(path: Path) -> list[Row]:
    """The rows of a run's metrics.parquet; a missing or unreadable file is one clear error naming it."""
    if not path.is_file():
        raise RaysimError(
            f"{path} is missing but the run has a checkpoint: the finished rounds' records are gone, so this "
            "run cannot be resumed with a true summary; start a fresh run"
        )
    try:
        table = pq.read_table(path).to_pylist()
    except Exception as error:  # noqa: BLE001 - any unreadable file: say which and why
        raise RaysimError(
            f"{path} cannot be read ({type(error).__name__}: {str(error).splitlines()[0][:120]}): this run "
            "cannot be resumed with a true summary; start a fresh run"
        ) from None
    return [(r["round"], r["client"], r["metric"], r["value"]) for r in table]
