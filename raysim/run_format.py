"""Runs made by older raysim code, read as what they ran: every compatibility rule in one place.

A run directory says the format it was written in (summary.json's `run_format`):

- 1: no number (every run made before it was written). Its config may lack an algorithm parameter
  added since (declared with raysim.algorithm.added_param); its summary may lack `selection`,
  `selected_round` and `selected_accuracy` (the run selected its final model) and `last5_accuracy`
  (read as absent); its folder may lack data.json (raysim.resume.check_unrecorded_data decides
  whether it goes on).
- 2: summary.json holds `run_format`; the stored config holds every parameter of its algorithm.

A parameter added later declares the format it came with (added_param's `since`): a stored config of
an earlier format takes the parameter's `before` value, that is what its run ran; a config of that
format or later holds the key. --resume (raysim.resume), raysim reproduce's check of a stored run
(raysim.reproduce.runs) and every reader of summaries (raysim.report, raysim.reproduce.table_output)
read a stored run through this module, so a run is never counted as, or continued in, a reading it
did not run.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from raysim.algorithm import BEFORE, SINCE
from raysim.config.schema import DEFAULT_ALGORITHM
from raysim.errors import RaysimError
from raysim.registry import algorithm_class

RUN_FORMAT = 2  # what this code writes; raise it with a rule below for each change a reader must know


def made_at(summary: dict[str, Any] | None) -> int:
    """The format a run directory was written in, from its summary.json (None: not written yet, or
    removed: read as the oldest, which fills nothing the stored config states)."""
    value = (summary or {}).get("run_format")
    return value if isinstance(value, int) and not isinstance(value, bool) and 1 <= value else 1


def config_as_made(tree: dict[str, Any], format: int = 1) -> dict[str, Any]:
    """A stored config with each algorithm parameter added after `format` set to what its run ran:
    the parameter's `before` value (added_param). A key the config states is kept."""
    algorithm = tree.get("algorithm")
    if not isinstance(algorithm, dict):
        return tree
    try:
        cls = algorithm_class(str(algorithm.get("name", DEFAULT_ALGORITHM)))
    except RaysimError:
        return tree  # refused where the config is read, in one line
    earlier = {
        f.name: f.metadata[BEFORE]
        for f in dataclasses.fields(cls.Params)
        if BEFORE in f.metadata and f.metadata[SINCE] > format and f.name not in algorithm
    }
    return {**tree, "algorithm": {**algorithm, **earlier}} if earlier else tree


def summary_as_made(summary: dict[str, Any]) -> dict[str, Any]:
    """A stored summary.json with the readings its format lacks stated as that run made them: a run
    written before `selection` existed selected its final model (eval.selection=final)."""
    if "selection" in summary:
        return summary
    return {
        **summary,
        "selection": "final",
        "selected_round": summary.get("rounds"),
        "selected_accuracy": summary.get("final_accuracy"),
    }
