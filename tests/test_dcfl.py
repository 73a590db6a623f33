"""DCFL: CKA on planted client groups, the grouping and selection rules, byte accounting, determinism
across actor counts, and resume."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F

from raysim.algorithms.condensed.dcfl import (
    cka_label_spearman,
    complementary_group,
    exploit_probabilities,
    random_group,
)
from raysim.algorithms.condensed.similarity import cka_matrix
from raysim.config.load import load_config
from raysim.data.embedded import embedded_source
from raysim.errors import RaysimError
from raysim.models import build_model
from raysim.outputs.metrics import is_timing
from raysim.tensors import load_weights, module_weights, serialized_nbytes
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
    assert config.algorithm.mu == 0.01


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
    classifier = 10 * 128 * 4  # cka_on: initial, a late first-timer's classifier trained from w^0
    for round_index in sorted(participants):
        for k in participants[round_index]:
            down, up = value[(round_index, k, "bytes_down")], value[(round_index, k, "bytes_up")]
            received = value[(round_index, k, "received_images")]
            if k not in first_seen:  # first visit: the model down; model, condensed set (2 classes x ipc 2) up
                # after pre-training (round 1) the global model has left w^0: w^0 travels too
                late = round_index > 1
                assert received == 0 and 0 < down - shared * (1 + late) < 150
                assert 0 < up - shared - 4 * image - 2 * label - late * classifier < framing + 100 * late
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


@pytest.mark.slow  # a whole run or more (pytest -m "not slow" skips it)
def test_a_resumed_dcfl_run_continues_to_the_same_numbers(dcfl_run, tmp_path):
    """The CKA matrix, the pool of condensed sets, the seen clients and the clients' own condensed sets
    are state: extending a 2-round run to 4 rounds equals running 4 at once."""
    from raysim.runner import resume_config, run_experiment

    _, reference = dcfl_run
    _, part = run(tmp_path, "part", rounds=2)
    run_experiment(resume_config(part, ["rounds=4"]), part)
    assert deterministic_rows(part) == deterministic_rows(reference)


# ------------------------------------------------------------------ issue 44: the mechanism


def _embedded_tensors():
    ds = embedded_source(None).build()
    x = (torch.from_numpy(ds.train_x.astype(np.float32) / 255).permute(0, 3, 1, 2) - 0.286) / 0.353
    return x, torch.from_numpy(ds.train_y)


def _fit(model, x, y, idx, lr: float, seed: int) -> None:
    """One epoch of SGD (momentum 0.9, batch 32) on the images idx."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    for b in torch.randperm(len(idx), generator=torch.Generator().manual_seed(seed)).split(32):
        loss = F.cross_entropy(model(x[idx[b]]), y[idx[b]])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def _mlp():
    return build_model("mlp", in_channels=1, num_classes=10, image_size=28)


def _planted_groups_from_different_global_models(cka_on: str) -> tuple[np.ndarray, list[int]]:
    """Three groups of two clients sharing a label set; client k is first seen in round k, when the
    global model is the k-th snapshot of a model trained on all classes (a different start for
    every client), and trains one epoch on its data, as a DCFL client does. Its reply goes through
    DCFL's own `update_cka` (with `initial`, the reply carries the classifier of a copy of w^0 trained
    on the same data, as `classifier_from_initial` makes it). Returns M and each client's group."""
    torch.manual_seed(0)
    x, y = _embedded_tensors()
    model = _mlp()
    snapshots = [module_weights(model)]
    for r in range(5):
        _fit(model, x, y, torch.randperm(len(y), generator=torch.Generator().manual_seed(r))[:4000], 0.05, r)
        snapshots.append(module_weights(model))
    config = load_config(ROOT / "configs" / "quickstart.yaml", tiny_overrides(**DCFL, **{"algorithm.cka_on": cka_on}))
    from raysim.registry import make_algorithm

    dcfl = make_algorithm(config)
    state = {"classifiers": {}, "cka": np.full((6, 6), np.nan), "weights": snapshots[0]}
    group_of = []
    for g, labels in enumerate([(0, 1, 2), (3, 4, 5), (6, 7, 8)]):
        own = torch.nonzero(torch.isin(y, torch.tensor(labels))).flatten()
        for half in range(2):
            k = len(group_of)
            idx = own[half::2][:300]
            client = _mlp()
            load_weights(client, snapshots[k])
            _fit(client, x, y, idx, 0.01, 10 + k)
            message = {"weights": module_weights(client)}
            if cka_on == "initial" and k > 0:
                copy = _mlp()
                load_weights(copy, snapshots[0])
                _fit(copy, x, y, idx, 0.01, 20 + k)
                message["cka_classifier"] = copy.classifier.weight.detach().numpy().copy()
            state["weights"] = snapshots[k]  # the model this round's replies trained from
            dcfl.update_cka(state, k, message)
            group_of.append(g)
    return state["cka"], group_of


def _recovered(m: np.ndarray, group_of: list[int]) -> list[bool]:
    """Per client: is every group mate more similar to it than every client of another group?"""
    out = []
    for k in range(len(group_of)):
        within = [m[k, j] for j in range(len(group_of)) if j != k and group_of[j] == group_of[k]]
        across = [m[k, j] for j in range(len(group_of)) if group_of[j] != group_of[k]]
        out.append(min(within) > max(across))
    return out


@pytest.mark.slow  # trains 20 client models: about 10 s
def test_cka_grouping_recovers_planted_groups_when_clients_start_from_different_global_models():
    """The default (`cka_on: initial`) compares classifiers trained from w^0 and recovers every group,
    and the complement rule crosses them; comparing the newest classifiers (`latest`, raysim before
    issue 44) mostly measures the global model each client started from and misses groups."""
    m, group_of = _planted_groups_from_different_global_models("initial")
    assert all(_recovered(m, group_of)), m.round(3)
    for k in range(6):
        assert all(group_of[j] != group_of[k] for j in complementary_group(m, list(range(6)), k, 4, "low"))
    stale, _ = _planted_groups_from_different_global_models("latest")
    assert not all(_recovered(stale, group_of)), stale.round(3)


def test_random_grouping_draws_seen_clients_of_the_group_size_seeded_by_round_and_client():
    seen = [0, 2, 3, 5, 7, 9]
    group = random_group(0, 4, seen, 3, 4)
    assert len(group) == 4 and 3 not in group and set(group) <= set(seen)
    assert group == random_group(0, 4, seen, 3, 4)
    assert {tuple(random_group(0, r, seen, 3, 4)) for r in range(10)} != {tuple(group)}
    assert random_group(0, 4, [1, 3], 3, 4) == [1]  # fewer seen clients than the group size


def test_cka_label_spearman_is_spearmans_rho_of_cka_against_label_histogram_similarity():
    from scipy.stats import spearmanr

    counts = np.array([[10, 0, 5], [8, 1, 4], [0, 9, 1], [1, 7, 0]], dtype=np.int64)
    rng = np.random.default_rng(0)
    cka = rng.uniform(size=(5, 5))
    cka = (cka + cka.T) / 2
    seen = [0, 1, 3]
    unit = counts / np.linalg.norm(counts, axis=1, keepdims=True)
    similar = unit @ unit.T
    pairs = [(0, 1), (0, 3), (1, 3)]
    expected = spearmanr([cka[i, j] for i, j in pairs], [similar[i, j] for i, j in pairs]).statistic
    assert cka_label_spearman(cka, counts, seen) == pytest.approx(expected)
    assert np.isnan(cka_label_spearman(cka, counts, [0, 1]))  # one pair: no ranking


def test_dcfl_logs_cka_label_spearman_and_selection_spread_as_described(dcfl_run):
    """Every round logs selection_spread (two clients are seen from round 1) and, from round 2 (three
    pairs whose label overlaps differ), cka_label_spearman; the last round's values, recomputed from the
    final checkpoint's M and the partition's label counts, are the ones in metrics and summary.json;
    the default CKA ranks client pairs by label overlap (rho well above 0)."""
    from raysim.outputs.run_dir import RunDir
    from raysim.runner import prepare

    summary, run_dir = dcfl_run
    values = {(r["round"], r["metric"]): r["value"] for r in rows(run_dir) if r["client"] is None}
    last = summary["rounds"]
    for metric, first in (("selection_spread", 1), ("cka_label_spearman", 2)):
        assert [r for r in range(1, last + 1) if (r, metric) in values] == list(range(first, last + 1))
        assert summary[metric] == pytest.approx(values[(last, metric)])
    state = RunDir(run_dir).read_checkpoint()["state"]
    counts = prepare(load_config(run_dir / "config.yaml")).counts
    rho = cka_label_spearman(state["cka"], counts, state["seen"])
    assert values[(last, "cka_label_spearman")] == pytest.approx(rho)
    p = exploit_probabilities(state["cka"], state["seen"])
    assert values[(last, "selection_spread")] == pytest.approx(p.max() / p.min())
    assert summary["cka_label_spearman"] > 0.5


def _finetune_client(epochs: int, lr: float) -> tuple[float, float, float]:
    """A returning client of classes {0, 1} receives 10 images of each of classes 2-9 (standing in
    for its group's condensed sets) and runs DCFL's client step from a model trained on all classes.
    Returns the relative change of the weights against training without the received images
    fine-tuned on, and the accuracy on held-out images of classes 2-9 before and after."""
    from raysim.algorithm import ClientData, Context, ModelSpec
    from raysim.registry import make_algorithm

    x, y = _embedded_tensors()
    config = load_config(
        ROOT / "configs" / "quickstart.yaml",
        tiny_overrides(
            **{
                **DCFL,
                "algorithm.finetune_epochs": epochs,
                "algorithm.finetune_lr": lr,
                "local.epochs": 2,
                "local.batch_size": 64,
                "algorithm.train_dsa": False,
            },
        ),
    )
    dcfl = make_algorithm(config)
    ctx = Context(config, ModelSpec(config, 1, 10, 28), torch.device("cpu"))
    torch.manual_seed(0)
    start = _mlp()
    _fit(start, x, y, torch.randperm(len(y), generator=torch.Generator().manual_seed(0))[:2000], 0.05, 0)
    own = torch.nonzero(y < 2).flatten()[:400]
    others = [torch.nonzero(y == c).flatten() for c in range(2, 10)]
    received = torch.cat([idx[:10] for idx in others])
    held_out = torch.cat([idx[-50:] for idx in others])

    def step(payload) -> torch.nn.Module:
        client = ClientData(
            id=0,
            round=3,
            x=x[own],
            y=y[own],
            label_counts=np.bincount(y[own].numpy(), minlength=10),
            arch=config.model,
            state={},
            generator=torch.Generator().manual_seed(1),
        )
        model = _mlp()
        load_weights(model, dcfl.client_update(payload, client, ctx)["weights"])
        return model

    weights = module_weights(start)
    plain = step({"weights": weights})
    tuned = step({"weights": weights, "extra_images": x[received].numpy(), "extra_labels": y[received].numpy()})
    flat = lambda m: torch.cat([p.detach().flatten() for p in m.parameters()])  # noqa: E731
    change = float((flat(tuned) - flat(plain)).norm() / (flat(plain) - flat(start)).norm())

    def accuracy(m):
        with torch.no_grad():
            return float((m(x[held_out]).argmax(1) == y[held_out]).float().mean())

    return change, accuracy(plain), accuracy(tuned)


def test_the_shipped_fine_tune_moves_the_model_measurably():
    """With the CPU configs' fine-tune settings (chosen on validation data) the fine-tune is a
    measurable step: it moves the weights by a sizeable fraction of what local training moved them,
    and it recovers accuracy on the received classes, which training on two classes had destroyed."""
    shipped = load_config(ROOT / "configs" / "dcfl" / "fmnist_dir0.1_cpu.yaml", ["dataset.root=/tmp"]).algorithm
    change, before, after = _finetune_client(shipped.finetune_epochs, shipped.finetune_lr)
    assert change > 0.5, change
    assert after > before + 0.15, (before, after)
