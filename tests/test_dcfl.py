"""DCFL: CKA on planted client groups, the grouping and selection rules, byte accounting, determinism
across actor counts, and resume."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F

from algorithms.dcfl import complementary_group, exploit_probabilities
from raysim.config import load_config
from raysim.data.embedded import embedded_source
from raysim.errors import RaysimError
from raysim.models import build_model
from raysim.outputs.metrics import is_timing
from raysim.similarity import cka_matrix
from raysim.tensors import module_weights, serialized_nbytes
from tests.conftest import tiny_overrides

ROOT = Path(__file__).resolve().parents[1]
# 6 clients with two classes each, the MLP, 3 per round; round 1 pre-trains, then 3 training rounds
DCFL = {
    "algorithm.name": "dcfl",
    "rounds": 4,
    "clients.num": 6,
    "clients.per_round": 3,
    "partition.kind": "classes",
    "partition.classes_per_client": 2,
    "model.name": "mlp",
    "local.epochs": 1,
    "algorithm.ipc": 2,
    "algorithm.steps": 5,
    "algorithm.real_batch": 16,
    "algorithm.pretrain_rounds": 1,
    "algorithm.pretrain_fraction": 0.5,
    "algorithm.server_epochs": 20,
    "algorithm.finetune_batch": 8,
    "resources.in_process": True,
}


def run(tmp_path: Path, name: str, **overrides):
    from raysim.runner import run_experiment

    config = load_config(ROOT / "configs" / "quickstart.yaml", tiny_overrides(**{**DCFL, **overrides}))
    return run_experiment(config, tmp_path / name), tmp_path / name


def rows(run_dir: Path) -> list[dict]:
    return pq.read_table(run_dir / "metrics.parquet").to_pylist()


def deterministic_rows(run_dir: Path) -> list[tuple]:
    return [(r["round"], r["client"], r["metric"], r["value"]) for r in rows(run_dir) if not is_timing(r["metric"])]


@pytest.fixture(scope="module")
def dcfl_run(tmp_path_factory):
    return run(tmp_path_factory.mktemp("dcfl"), "run")


def test_cka_of_classifiers_recovers_planted_client_groups_and_the_complement_rule_crosses_them():
    """Three groups of two clients sharing a label set ({0,1,2}, {3,4,5}, {6,7,8}), each client's MLP
    trained from one initial model: CKA within a group beats CKA across groups for every client, and
    complement=low gives each client the other groups (high: its own group first)."""
    torch.manual_seed(0)
    ds = embedded_source(None).build()
    x = (torch.from_numpy(ds.train_x.astype(np.float32) / 255).permute(0, 3, 1, 2) - 0.286) / 0.353
    y = torch.from_numpy(ds.train_y)
    init = build_model("mlp", in_channels=1, num_classes=10, image_size=28).state_dict()
    classifiers, group_of = [], []
    for g, labels in enumerate([(0, 1, 2), (3, 4, 5), (6, 7, 8)]):
        own = torch.nonzero(torch.isin(y, torch.tensor(labels))).flatten()
        for half in range(2):
            idx = own[half::2][:300]
            model = build_model("mlp", in_channels=1, num_classes=10, image_size=28)
            model.load_state_dict(init)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
            order = torch.Generator().manual_seed(len(classifiers))
            for _ in range(2):
                for b in torch.randperm(len(idx), generator=order).split(32):
                    loss = F.cross_entropy(model(x[idx[b]]), y[idx[b]])
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
            classifiers.append(model.classifier.weight.detach().clone())
            group_of.append(g)
    m = cka_matrix(classifiers)
    clients = list(range(6))
    for k in clients:
        within = [m[k, j] for j in clients if j != k and group_of[j] == group_of[k]]
        across = [m[k, j] for j in clients if group_of[j] != group_of[k]]
        assert min(within) > max(across), (k, m.round(3))
        assert all(group_of[j] != group_of[k] for j in complementary_group(m, clients, k, 4, "low"))
        assert [group_of[j] for j in complementary_group(m, clients, k, 1, "high")] == [group_of[k]]


def test_exploit_probabilities_follow_cka_row_sums_over_seen_clients():
    cka = np.full((4, 4), np.nan)
    seen = [0, 2, 3]
    block = np.array([[1.0, 0.2, 0.6], [0.2, 1.0, 0.4], [0.6, 0.4, 1.0]])
    cka[np.ix_(seen, seen)] = block
    sums = np.array([0.8, 0.6, 1.0])
    assert np.allclose(exploit_probabilities(cka, seen), sums / sums.sum())
    assert np.allclose(exploit_probabilities(np.eye(4), [1]), [1.0])  # a lone client: no information


def test_dcfl_configuration_errors_are_one_clear_line():
    base = tiny_overrides(**DCFL)
    with pytest.raises(RaysimError, match="algorithm.mu is not a parameter of base 'fedavg'"):
        load_config(ROOT / "configs" / "quickstart.yaml", base + ["algorithm.mu=0.01"])
    with pytest.raises(RaysimError, match="algorithm.base must be one of fedavg, fedprox, fednova, feddisco"):
        load_config(ROOT / "configs" / "quickstart.yaml", base + ["algorithm.base=scaffold"])
    with pytest.raises(RaysimError, match="leaves no training round"):
        load_config(ROOT / "configs" / "quickstart.yaml", base + ["algorithm.pretrain_rounds=4"])
    config = load_config(ROOT / "configs" / "quickstart.yaml", base + ["algorithm.base=fedprox", "algorithm.mu=0.01"])
    assert config.algorithm["mu"] == 0.01


def test_dcfl_learns_selects_unseen_clients_first_and_counts_bytes_exactly(dcfl_run):
    summary, run_dir = dcfl_run
    assert summary["best_accuracy"] > 0.25  # chance is 0.1; two classes per client make the curve jumpy
    records = rows(run_dir)
    participants = {}
    for r in records:
        if r["client"] is not None and r["metric"] == "bytes_down":
            participants.setdefault(r["round"], []).append(r["client"])
    # round 1 pre-trains: 3 of 6 clients asked, all new; by round 2 exploration fills in the unseen
    assert len(participants[1]) == 3
    assert summary["clients_seen"] == 6
    value = {(r["round"], r["client"], r["metric"]): r["value"] for r in records if r["client"] is not None}
    model = build_model("mlp", in_channels=1, num_classes=10, image_size=28)
    shared = serialized_nbytes({"weights": module_weights(model)})
    image, label = 28 * 28 * 4, 8  # float32 pixels, int64 labels
    first_seen = set()
    returning = 0
    framing = 400  # pickle's bytes around the arrays: keys, dtypes, shapes (counted without its memo)
    for round_index in sorted(participants):
        for k in participants[round_index]:
            down, up = value[(round_index, k, "bytes_down")], value[(round_index, k, "bytes_up")]
            received = value[(round_index, k, "received_images")]
            if k not in first_seen:  # first visit: the model down; model, condensed set (2 classes x ipc 2) up
                assert received == 0 and 0 < down - shared < 100
                assert 0 < up - shared - 4 * image - 2 * label < framing
                first_seen.add(k)
            else:  # returning: the model and its group's condensed images down, the model up
                returning += 1
                assert received > 0
                assert 0 < down - shared - received * (image + label) < framing
                assert 0 < up - shared < framing
    assert returning > 0


def test_dcfl_gives_the_same_numbers_on_one_and_two_actors(dcfl_run, ray_session, tmp_path):
    _, reference = dcfl_run
    for actors in (1, 2):
        _, run_dir = run(tmp_path, f"actors{actors}", **{"resources.in_process": False, "resources.actors": actors})
        assert deterministic_rows(run_dir) == deterministic_rows(reference)


def test_a_resumed_dcfl_run_continues_to_the_same_numbers(dcfl_run, tmp_path):
    """The CKA matrix, the pool of condensed sets, the seen clients and the clients' own condensed sets
    are state: extending a 2-round run to 4 rounds equals running 4 at once."""
    from raysim.runner import resume_config, run_experiment

    _, reference = dcfl_run
    _, part = run(tmp_path, "part", rounds=2)
    run_experiment(resume_config(part, ["rounds=4"]), part)
    assert deterministic_rows(part) == deterministic_rows(reference)
