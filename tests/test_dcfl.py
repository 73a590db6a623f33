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
    sampled_group,
    sampling_probabilities,
    sets_sent_coverage,
)
from raysim.algorithms.condensed.similarity import cka_matrix
from raysim.data.embedded import embedded_source
from raysim.errors import RaysimError
from raysim.experiment import load_config
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
    with pytest.raises(RaysimError, match="'algorithm.base' must be one of fedavg, fedprox, fednova, feddisco"):
        load_config(ROOT / "configs" / "quickstart.yaml", base + ["algorithm.base=scaffold"])
    with pytest.raises(RaysimError, match="use_condensed: none sends none"):
        load_config(
            ROOT / "configs" / "quickstart.yaml", base + ["algorithm.use_condensed=none", "algorithm.filter_ratio=0.2"]
        )
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
    image, label = 28 * 28 * 4, 8  # float32 pixels; the classes of a set, int64
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
            else:  # returning: the model, the group's ids and the group's sets it lacks down, the model up
                returning += 1
                new = value[(round_index, k, "received_new_images")]
                assert received > 0 and new <= received
                group, sets = received // 4, new // 4  # each set: 2 classes x ipc 2 (no filter)
                # the group's ids (int64), the new sets' images and classes
                assert 0 < down - shared - 8 * group - sets * (4 * image + 2 * label) < framing + 150 * sets
                assert 0 < up - shared < framing
    assert returning > 0


def test_dcfl_gives_the_same_numbers_on_one_and_two_actors(dcfl_run, ray_session, tmp_path):
    """The reference ran in process: one client runtime, as on one actor (tests/conftest.py: run_tiny)."""
    _, reference = dcfl_run
    _, run_dir = run(tmp_path, "actors2", **{"resources.in_process": False, "resources.actors": 2})
    assert deterministic_rows(run_dir) == deterministic_rows(reference)


@pytest.mark.slow  # a whole run or more (pytest -m "not slow" skips it)
def test_a_resumed_dcfl_run_continues_to_the_same_numbers(dcfl_run, tmp_path):
    """The CKA matrix, the pool of condensed sets, the seen clients and the clients' own condensed sets
    are state: extending a 2-round run to 4 rounds equals running 4 at once."""
    from raysim.resume import resume_config
    from raysim.runner import run_experiment

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
    received_set = {"images": x[received].numpy(), "classes": np.arange(2, 10)}  # 10 images a class, class by class
    tuned = step({"weights": weights, "group": np.array([5]), "new_sets": {5: received_set}})
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


# ------------------------------------------------------------------ issue 58: coverage of the groups


def _planted_hub_cka(num: int = 20) -> np.ndarray:
    """A CKA matrix whose lowest-CKA pair of partners is {0, 1} for every other client: clients 0 and
    1 have CKA 0.5 / 0.55 to everyone, client 2 has 0.8, the rest 0.9 plus a little noise in [0, 0.05)."""
    rng = np.random.default_rng(0)
    m = 0.9 + rng.uniform(0, 0.05, size=(num, num))
    m = (m + m.T) / 2
    for hub, value in ((2, 0.8), (1, 0.55), (0, 0.5)):
        m[hub, :] = m[:, hub] = value
    np.fill_diagonal(m, 1.0)
    return m


def _dcfl(**overrides):
    from raysim.registry import make_algorithm

    return make_algorithm(load_config(ROOT / "configs" / "quickstart.yaml", tiny_overrides(**{**DCFL, **overrides})))


def _deliveries(grouping: str, rounds: int = 30) -> np.ndarray:
    """DCFL's delivery counts after `rounds` rounds of 5 returning clients of 20 (all seen; groups of 2)
    on the planted hub matrix, through DCFL's own `count_deliveries`."""
    dcfl = _dcfl(
        **{"clients.num": 20, "clients.per_round": 5, "algorithm.group_size": 2, "algorithm.grouping": grouping}
    )
    state = {"seen": list(range(20)), "cka": _planted_hub_cka(), "sent": np.zeros(20, dtype=np.int64)}
    rng = np.random.default_rng(1)
    for round_index in range(2, 2 + rounds):
        participants = sorted(int(k) for k in rng.choice(20, size=5, replace=False))
        state["sent"] = dcfl.count_deliveries(state, round_index, participants)
    return state["sent"]


def test_sets_sent_coverage_counts_the_clients_reached_and_the_gini_of_the_delivery_counts():
    seen = list(range(20))
    hubs = np.zeros(25, dtype=np.int64)
    hubs[[0, 1]] = 7  # two hubs among 20 seen clients make every delivery (clients 20-24 unseen)
    assert sets_sent_coverage(hubs, seen) == {
        "sets_sent_clients": 2,
        "sets_sent_fraction": 0.1,
        "sets_sent_gini": pytest.approx(0.9),  # 1 - h/n
    }
    even = np.zeros(25, dtype=np.int64)
    even[:20] = 3
    assert sets_sent_coverage(even, seen)["sets_sent_gini"] == pytest.approx(0.0)
    assert sets_sent_coverage(np.zeros(25), seen) == {"sets_sent_clients": 0, "sets_sent_fraction": 0.0}


def test_the_coverage_diagnostic_finds_the_hub_of_cka_grouping_and_cka_sampled_reaches_every_client():
    """On a planted M where clients 0 and 1 are everyone's lowest-CKA partners, today's grouping sends
    only the sets of 0, 1 and 2 (2 is the hubs' own next partner), concentrated on the hubs, in every
    round; cka_sampled, redrawn each round, sends every client's set, less concentrated, and still
    sends the hubs' sets most often."""
    fixed = _deliveries("cka")
    assert set(np.flatnonzero(fixed)) == {0, 1, 2}
    coverage = sets_sent_coverage(fixed, list(range(20)))
    assert coverage["sets_sent_clients"] == 3 and coverage["sets_sent_fraction"] == pytest.approx(0.15)
    assert coverage["sets_sent_gini"] > 0.85
    sampled = _deliveries("cka_sampled")
    spread = sets_sent_coverage(sampled, list(range(20)))
    assert spread["sets_sent_clients"] == 20 and spread["sets_sent_fraction"] == 1.0
    assert spread["sets_sent_gini"] < 0.5
    assert set(np.argsort(-sampled, kind="stable")[:2]) == {0, 1}  # dissimilar clients still preferred
    assert sets_sent_coverage(_deliveries("random"), list(range(20)))["sets_sent_clients"] == 20


def test_cka_sampled_groups_are_reproducible_and_prefer_the_lowest_cka_clients():
    m = _planted_hub_cka()
    seen = list(range(20))
    group = sampled_group(m, seen, 7, 4, 0.5, "low", 0, 3)
    assert len(group) == 4 and 7 not in group and group == sorted(group)
    assert group == sampled_group(m, seen, 7, 4, 0.5, "low", 0, 3)  # same seed, round, client: same group
    assert {tuple(sampled_group(m, seen, 7, 4, 0.5, "low", 0, r)) for r in range(10)} != {tuple(group)}
    assert (
        sampled_group(m, [3, 7], 7, 4, 0.5, "low", 0, 3) == [3] and sampled_group(m, [7], 7, 4, 0.5, "low", 0, 3) == []
    )
    counts = np.zeros(20)
    for r in range(2000):
        counts[sampled_group(m, seen, 7, 2, 0.5, "low", 0, r)] += 1
    assert counts.argmax() == 0 and counts[1] > counts[2] > counts[[k for k in range(3, 20) if k != 7]].max()
    assert (counts[[k for k in range(20) if k != 7]] > 0).all()
    # the temperature spans the two other rules: near 0 today's lowest-CKA group, large nearly uniform
    assert sampled_group(m, seen, 7, 2, 1e-3, "low", 0, 5) == complementary_group(m, seen, 7, 2, "low")
    assert sampled_group(m, seen, 7, 2, 1e-3, "high", 0, 5) == complementary_group(m, seen, 7, 2, "high")
    row = np.array([0.5, 0.7, 0.9, 0.6])
    p = sampling_probabilities(row, 0.5, "low")
    assert p.argmax() == 0 and p.max() / p.min() == pytest.approx(np.exp(2)) and p.sum() == pytest.approx(1)
    assert np.allclose(sampling_probabilities(row, 0.5, "high"), sampling_probabilities(1.4 - row, 0.5, "low"))
    assert np.allclose(sampling_probabilities(row, 1e6, "low"), 0.25)
    assert np.allclose(sampling_probabilities(np.full(3, 0.9), 0.5, "low"), 1 / 3)
    with pytest.raises(RaysimError, match="algorithm.group_temperature must be > 0"):
        _dcfl(**{"algorithm.grouping": "cka_sampled", "algorithm.group_temperature": 0})


def test_a_cka_sampled_run_logs_the_coverage_per_round_and_in_summary_json(dcfl_run, tmp_path):
    """End to end on the tiny settings: the coverage keys are in metrics.parquet every round and in
    summary.json, and match the delivery counts in the final checkpoint (default run and cka_sampled)."""
    from raysim.outputs.run_dir import RunDir

    sampled = run(tmp_path, "sampled", **{"algorithm.grouping": "cka_sampled"})
    for summary, run_dir in (dcfl_run, sampled):
        state = RunDir(run_dir).read_checkpoint()["state"]
        expected = sets_sent_coverage(state["sent"], state["seen"])
        assert set(expected) == {"sets_sent_clients", "sets_sent_fraction", "sets_sent_gini"}
        assert {k: summary[k] for k in expected} == pytest.approx(expected)
        assert summary["sets_sent_clients"] >= 1 and int(state["sent"].sum()) > 0
        values = {(r["round"], r["metric"]): r["value"] for r in rows(run_dir) if r["client"] is None}
        reached = [values[(r, "sets_sent_clients")] for r in range(1, summary["rounds"] + 1)]
        assert reached[0] == 0 and reached == sorted(reached)  # round 1 pre-trains: nothing sent yet
        assert values[(summary["rounds"], "sets_sent_fraction")] == pytest.approx(summary["sets_sent_fraction"])


# ------------------------------------------------------------------ issue 76: each set travels to a client once


def _old_delivery(state, group: list[int], filter_ratio: float) -> tuple[np.ndarray, np.ndarray]:
    """What a returning client received before issue 76: its group's sets concatenated in group order,
    less the fraction filter_ratio of them with the highest loss (all the group's images together)."""
    from raysim.algorithms.condensed.dcfl import pool_arrays

    x, y = pool_arrays(state["pool"], group)
    if filter_ratio > 0:
        loss = np.concatenate([state["pool_loss"][k] for k in group])
        keep = np.sort(np.argsort(loss, kind="stable")[: max(1, round(len(loss) * (1 - filter_ratio)))])
        x, y = x[keep], y[keep]
    return x, y


@pytest.mark.parametrize("grouping", ["cka", "random", "cka_sampled"])
@pytest.mark.parametrize("filter_ratio", [0.0, 0.3])
def test_a_returning_client_trains_on_the_whole_group_delivery_and_is_sent_each_set_once(grouping, filter_ratio):
    """Over 12 rounds of 4 returning clients of 8 (groups of 3, sets of 1-3 classes, uint8 and float32
    sets, the losses changing every round): the images and labels a client assembles from the sets it
    holds plus those sent are exactly those the whole group's delivery gave, and no set is sent twice
    to a client; the server's record of what each client holds is what the client holds."""
    from types import SimpleNamespace

    from raysim.algorithm import Reply

    dcfl = _dcfl(
        **{
            "clients.num": 8,
            "clients.per_round": 4,
            "algorithm.grouping": grouping,
            "algorithm.group_size": 3,
            "algorithm.filter_ratio": filter_ratio,
        }
    )
    rng = np.random.default_rng(0)
    cka = rng.uniform(0.8, 1.0, size=(8, 8))
    pool = {}
    for k in range(8):
        classes = np.sort(rng.choice(10, size=int(rng.integers(1, 4)), replace=False))
        shape = (2 * len(classes), 1, 4, 4)
        images = rng.integers(0, 256, shape).astype(np.uint8) if k % 2 else rng.normal(size=shape).astype(np.float32)
        pool[k] = {"images": images, "classes": classes}
    state = {"weights": {}, "seen": list(range(8)), "cka": (cka + cka.T) / 2, "pool": pool, "held": {}}
    clients = {k: SimpleNamespace(id=k, state={}) for k in range(8)}
    sent = {k: set() for k in range(8)}
    reused = 0
    for round_index in range(2, 14):
        state["pool_loss"] = {k: rng.uniform(size=len(s["images"])) for k, s in pool.items()}
        participants = sorted(int(k) for k in rng.choice(8, size=4, replace=False))
        out = dcfl.broadcast(state, round_index, participants)
        groups = dcfl.round_groups(state, round_index, participants)
        for k in participants:
            payload = dict(out.shared)
            for to, part in out.addressed:
                if k in to:
                    payload.update(part)
            new = set(payload.get("new_sets", {}))
            assert not new & sent[k], (k, new, sent[k])  # no set twice to the same client
            sent[k] |= new
            reused += len(set(groups[k]) - new)
            x, y = dcfl.group_sets(payload, clients[k])
            old_x, old_y = _old_delivery(state, groups[k], filter_ratio)
            assert x.dtype == old_x.dtype and y.dtype == old_y.dtype
            np.testing.assert_array_equal(x, old_x)
            np.testing.assert_array_equal(y, old_y)
        state["held"] = dcfl.hold(state, groups, [Reply(k, 1, {}) for k in participants])
        for k in participants:
            assert sorted(clients[k].state["held"]) == state["held"][k] == sorted(sent[k])
    assert reused > 0  # held sets were used again


def _received_new_images(run_dir: Path) -> dict[int, float]:
    total = {}
    for r in rows(run_dir):
        if r["metric"] == "received_new_images":
            total[r["client"]] = total.get(r["client"], 0) + r["value"]
    return total


@pytest.mark.parametrize("grouping", ["cka", "random"])
def test_a_run_sends_each_set_to_a_client_once(dcfl_run, tmp_path, grouping):
    """End to end (the default grouping and the random control): the images sent whole to each client
    over the run are those of the sets the server's final state says it holds, each once (4 images a
    set), and returning clients trained on more images than were sent."""
    from raysim.outputs.run_dir import RunDir

    summary, run_dir = dcfl_run if grouping == "cka" else run(tmp_path, grouping, **{"algorithm.grouping": grouping})
    state = RunDir(run_dir).read_checkpoint()["state"]
    sent = _received_new_images(run_dir)
    assert {k: 4 * len(v) for k, v in state["held"].items()} == {k: v for k, v in sent.items() if v}
    received = sum(r["value"] for r in rows(run_dir) if r["metric"] == "received_images")
    assert received > sum(sent.values()) > 0
    assert summary["sets_sent_clients"] >= 1


@pytest.mark.slow  # a whole run
def test_use_condensed_none_without_pretraining_condenses_and_uploads_no_set(tmp_path):
    """DCFL's base with DSA on the local batches and random selection (Table IV's "DSA alone" row): no
    client condenses, every upload is the model and the base's entries, nothing is received."""
    from raysim.outputs.run_dir import RunDir

    overrides = {
        "algorithm.pretrain_rounds": 0,
        "algorithm.use_condensed": "none",
        "algorithm.selection": "random",
        "rounds": 3,
    }
    summary, run_dir = run(tmp_path, "none", **overrides)
    state = RunDir(run_dir).read_checkpoint()["state"]
    assert state["pool"] == {} and state["held"] == {}
    assert summary["clients_seen"] == len(state["seen"]) > 3
    values = {(r["round"], r["client"], r["metric"]): r["value"] for r in rows(run_dir) if r["client"] is not None}
    shared = serialized_nbytes({"weights": module_weights(_mlp())})
    classifier = 10 * 128 * 4  # first-timers after round 1 also send w^0's classifier (cka_on: initial)
    ups = [v for (_, _, metric), v in values.items() if metric == "bytes_up"]
    assert ups and all(0 < up - shared < 400 + classifier for up in ups)
    assert all(v == 0 for (_, _, metric), v in values.items() if metric == "received_images")
    assert not any(metric == "condense_loss" for (_, _, metric) in values)


@pytest.mark.parametrize(
    ("overrides", "trains_copy"),
    [
        ({}, True),  # eq. 4's selection reads M
        ({"algorithm.selection": "random"}, True),  # CKA groups still read M
        ({"algorithm.selection": "random", "algorithm.grouping": "random"}, False),
        ({"algorithm.selection": "random", "algorithm.use_condensed": "none", "algorithm.pretrain_rounds": 0}, False),
    ],
)
def test_a_late_first_timer_trains_a_copy_of_w0_only_where_cka_decides_something(overrides, trains_copy):
    """cka_on: initial sends w^0 to a client first seen after the model left it, so that M compares
    classifiers trained from one start: work and bytes spent only where M picks clients or groups."""
    dcfl = _dcfl(**{"algorithm.cka_on": "initial", **overrides})
    state = {"weights": {}, "initial": {}, "seen": [0], "cka": np.full((6, 6), np.nan), "pool": {}, "held": {}}
    out = dcfl.broadcast(state, 5, [0, 1])
    sent = {k: set(part) for group, part in out.addressed for k in group}
    assert ("cka_from" in sent.get(1, set())) is trains_copy
