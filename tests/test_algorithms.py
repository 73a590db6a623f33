"""Consistency checks that could fail: each variant reduces to FedAvg where its paper says it must."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from raysim.outputs.run_dir import RunDir
from raysim.outputs.state_files import load_state
from raysim.registry import builtin_names
from tests.test_dynafed import TINY as DYNAFED
from tests.test_fedaf import TINY_CONDENSATION


def server_values(run_dir, metric="accuracy"):
    rows = pq.read_table(run_dir / "metrics.parquet").to_pylist()
    return [r["value"] for r in rows if r["client"] is None and r["metric"] == metric]


def final_weights(run_dir):
    return load_state(run_dir / "checkpoints/final_model.pt", "")


def assert_same_weights(a, b, exact=True):
    assert a.keys() == b.keys()
    for key in a:
        if exact:
            assert np.array_equal(a[key], b[key]), key
        else:
            np.testing.assert_allclose(a[key], b[key], rtol=1e-4, atol=1e-5, err_msg=key)


# the reductions to FedAvg hold on any model: the MLP's runs take a fifth of the tiny convnet's
MLP = {"model.name": "mlp"}


def test_fedprox_with_mu_zero_is_fedavg(run_tiny):
    _, avg = run_tiny(**MLP, **{"algorithm.name": "fedavg"})
    _, prox = run_tiny(**MLP, **{"algorithm.name": "fedprox", "algorithm.mu": 0.0})
    assert server_values(avg, "loss") == server_values(prox, "loss")
    assert_same_weights(final_weights(avg), final_weights(prox))
    _, prox_on = run_tiny(**MLP, **{"algorithm.name": "fedprox", "algorithm.mu": 1.0})
    assert server_values(prox_on, "loss") != server_values(avg, "loss")


def test_moon_with_mu_zero_is_fedavg_and_feddisco_without_discrepancy_is_fedavg(run_tiny):
    _, avg = run_tiny(**MLP, **{"algorithm.name": "fedavg"})
    _, moon = run_tiny(**MLP, **{"algorithm.name": "moon", "algorithm.mu": 0.0})
    _, disco = run_tiny(**MLP, **{"algorithm.name": "feddisco", "algorithm.a": 0.0, "algorithm.b": 0.0})
    assert_same_weights(final_weights(avg), final_weights(moon))
    assert_same_weights(final_weights(avg), final_weights(disco), exact=False)
    _, disco_on = run_tiny(**MLP, **{"algorithm.name": "feddisco", "partition.alpha": 0.1})
    _, avg_skew = run_tiny(**MLP, **{"algorithm.name": "fedavg", "partition.alpha": 0.1})
    assert server_values(disco_on, "loss") != server_values(avg_skew, "loss")


def test_fednova_with_equal_plain_sgd_steps_is_fedavg(run_tiny):
    # IID clients of equal size and plain SGD: every a_i = tau, so FedNova reduces to FedAvg.
    common = {"partition.kind": "iid", "local.momentum": 0.0}
    _, avg = run_tiny(**MLP, **common, **{"algorithm.name": "fedavg"})
    _, nova = run_tiny(**MLP, **common, **{"algorithm.name": "fednova"})
    assert_same_weights(final_weights(avg), final_weights(nova), exact=False)


def test_fedbn_without_batchnorm_is_fedavg_and_keeps_bn_local_with_it(run_tiny):
    _, avg = run_tiny(**{"algorithm.name": "fedavg", "model.name": "mlp"})
    _, bn = run_tiny(**{"algorithm.name": "fedbn", "model.name": "mlp"})
    assert_same_weights(final_weights(avg), final_weights(bn))
    _, bn_conv = run_tiny(**{"algorithm.name": "fedbn", "rounds": 2, "model.name": "convnet"})  # batch-norm layers
    state = load_state(sorted((bn_conv / "client_state/client_00000").glob("r*.pt"))[-1], "")
    assert any("running_mean" in k for k in state["bn"])


def client_state(run_dir, client, round_index):
    return load_state(run_dir / f"client_state/client_{client:05d}/r{round_index:06d}.pt", "")


def test_scaffold_control_variates_persist_across_rounds(run_tiny):
    _, run_dir = run_tiny(**{"algorithm.name": "scaffold", "rounds": 3})
    # two newest files per client are kept: rounds 2 and 3
    files = sorted(p.name for p in (run_dir / "client_state/client_00000").glob("r*.pt"))
    assert files == ["r000002.pt", "r000003.pt"]
    c2 = client_state(run_dir, 0, 2)["control"]
    c3 = client_state(run_dir, 0, 3)["control"]
    assert any(np.abs(v).sum() > 0 for v in c2.values())
    # c_i+ = c_i - c + (x - y_i)/(K lr): round 3 starts from round 2's c_i, so they differ but stay close in scale
    assert not all(np.array_equal(c2[k], c3[k]) for k in c2)
    final = RunDir(run_dir).read_checkpoint()["state"]
    assert any(np.abs(v).sum() > 0 for v in final["control"].values())
    # the default (population) keeps c the size-weighted mean of the c_i, and says so every round
    drift = server_values(run_dir, "control_drift")
    assert len(drift) == 3 and max(drift) < 1e-6
    assert json.loads((run_dir / "summary.json").read_text())["control_drift"] == drift[-1]


def scaffold_with(weighting, sizes, per_round):
    """SCAFFOLD on len(sizes) clients of those sizes, and a server context that knows them (as the
    engine's ctx.label_counts: one class here) and records what the server logs."""
    from types import SimpleNamespace

    from raysim.algorithm import ServerLog
    from raysim.experiment import load_config
    from raysim.registry import algorithm_class

    overrides = [
        "algorithm.name=scaffold",
        f"algorithm.weighting={weighting}",
        f"clients.num={len(sizes)}",
        f"clients.per_round={per_round}",
    ]
    config = load_config(Path(__file__).resolve().parents[1] / "configs/quickstart.yaml", overrides)
    ctx = SimpleNamespace(label_counts=np.array(sizes, np.int64)[:, None], log=ServerLog())
    return algorithm_class("scaffold")(config.algorithm, config), ctx


@pytest.mark.parametrize("weighting", ["population", "samples", "uniform", "mixed"])
def test_scaffold_moves_its_control_by_the_weights_that_average_the_models(weighting):
    """Two clients of 1 and 3 samples, every client in the round (|S|/N = n_S/n = 1), each sending as
    its control change what it sends as its model: with the same weights for both means (population,
    samples, uniform) the new control equals the new model, so sum_i p_i (c - c_i) = 0 and the
    corrections cancel in the average; `mixed` (models by size, controls plain) leaves them apart."""
    from raysim.algorithm import Reply

    scaffold, ctx = scaffold_with(weighting, [1, 3], per_round=2)
    zero = {"w": np.zeros(1, np.float32)}
    sent = [np.array([1.0], np.float32), np.array([5.0], np.float32)]
    replies = [
        Reply(i, n, {"weights": {"w": w}, "control_delta": {"w": w}}) for i, (n, w) in enumerate(zip([1, 3], sent))
    ]
    new = scaffold.server_update({"weights": zero, "control": zero}, replies, 1, ctx)
    model, control = float(new["weights"]["w"][0]), float(new["control"]["w"][0])
    expected = {"population": (4.0, 4.0), "samples": (4.0, 4.0), "uniform": (3.0, 3.0), "mixed": (4.0, 3.0)}
    assert (model, control) == expected[weighting]


@pytest.mark.parametrize("weighting", ["population", "uniform", "samples", "mixed"])
def test_scaffold_population_keeps_c_the_size_weighted_mean_of_all_clients_controls(weighting):
    """Eight rounds of 2 of 6 clients of very unequal sizes, each participant moving its c_i as
    option II does (c_i+ = c_i - c + its own drift): `population` keeps c = sum_i (n_i / n) c_i over
    all six clients (the truth held here, not the server's copy), and `uniform` c = the plain mean
    (its models' weights), both with control_drift ~0; `samples` (|S|/N for n_S/n) and `mixed`
    leave c off the size-weighted mean, and control_drift says so."""
    import torch

    from raysim.algorithm import Reply

    sizes = np.array([5, 400, 12, 60, 1, 150])
    scaffold, ctx = scaffold_with(weighting, sizes.tolist(), per_round=2)
    state = scaffold.server_init(torch.nn.Linear(3, 2), ctx)
    rng = np.random.default_rng(0)
    own_drift = [{n: rng.normal(size=v.shape).astype(np.float32) for n, v in state["control"].items()} for _ in sizes]
    c_i = [{n: np.zeros_like(v) for n, v in state["control"].items()} for _ in sizes]
    drifts = []
    for round_index in range(1, 9):
        replies = []
        for k in sorted(rng.choice(len(sizes), 2, replace=False).tolist()):
            new = {n: (c_i[k][n] - state["control"][n] + own_drift[k][n]).astype(np.float32) for n in c_i[k]}
            delta = {n: new[n] - c_i[k][n] for n in new}
            c_i[k] = new
            replies.append(Reply(k, int(sizes[k]), {"weights": state["weights"], "control_delta": delta}))
        state = scaffold.server_update(state, replies, round_index, ctx)
        drifts.append(ctx.log.scalars["control_drift"])
    assert ctx.log.summary["control_drift"] == drifts[-1]
    p = (sizes / sizes.sum()) if weighting != "uniform" else np.full(len(sizes), 1 / len(sizes))
    truth = {n: sum(p[k] * c_i[k][n].astype(np.float64) for k in range(len(sizes))) for n in state["control"]}
    gap = np.sqrt(sum(np.sum((state["control"][n] - truth[n]) ** 2) for n in truth))
    relative = gap / np.sqrt(sum(np.sum(truth[n] ** 2) for n in truth))
    assert drifts[-1] == pytest.approx(relative, rel=1e-3, abs=1e-6)  # the server's reading is the truth's
    if weighting in ("population", "uniform"):
        assert max(drifts) < 1e-6 and relative < 1e-6
    else:
        assert min(drifts) > 1e-2 and relative > 1e-2


def test_feddyn_gradient_state_persists(run_tiny):
    _, run_dir = run_tiny(**{"algorithm.name": "feddyn", "rounds": 2})
    g2 = client_state(run_dir, 0, 2)["grad"]
    g1 = client_state(run_dir, 0, 1)["grad"]
    assert any(np.abs(v).sum() > 0 for v in g1.values())
    assert not all(np.array_equal(g1[k], g2[k]) for k in g1)
    final = RunDir(run_dir).read_checkpoint()["state"]
    assert any(np.abs(v).sum() > 0 for v in final["h"].values())


# Settings under which the heavier algorithms learn at the tiny scale (the others need none).
LEARNS_WITH = {
    "fedaf": {**TINY_CONDENSATION, "algorithm.server_epochs": 20, "algorithm.server_lr": 0.05},
    "feddm": {**TINY_CONDENSATION, "algorithm.server_epochs": 20, "algorithm.server_lr": 0.05},
    "dynafed": DYNAFED,
    "dcfl": {
        **TINY_CONDENSATION,
        "algorithm.server_epochs": 20,
        "algorithm.server_lr": 0.05,
        "algorithm.pretrain_fraction": 0.5,
    },
}
# The one-shot methods (one client round, then distillation epochs) on near-IID clients, whose
# ensemble is a good teacher: at alpha 0.1 a 6-client ensemble of this tiny net is not.
ONE_SHOT = {
    "rounds": 4,  # the client round and three distillation epochs (measured finals: 0.40-0.82, chance 0.1)
    "partition.alpha": 100.0,
    "model.name": "cnn2",  # batch-norm layers: the generators' BN-statistics loss is at work
    "local.epochs": 3,
    "algorithm.cache_client_stage": False,
    "algorithm.nz": 32,
    "algorithm.ngf": 16,
    "algorithm.generator_steps": 10,
    "algorithm.synthesis_batch": 64,
    "algorithm.kd_batch": 16,
    "algorithm.stratify_steps": 5,
    "algorithm.stratify_batch": 8,  # FedHydra's 60 generators (6 clients x 10 classes): most of its run
}
LEARNS_WITH.update({name: ONE_SHOT for name in ("fedavg_oneshot", "dense", "coboosting", "fedhydra")})
# FedHydra's stratified teacher learns slower here: 0.249 (one torch thread) and 0.254 (two) after
# three distillation epochs, 0.369 and 0.373 after four
LEARNS_WITH["fedhydra"] = {**ONE_SHOT, "rounds": 5}
# OT fusion compares activations on unlabelled images: here the training images, without labels
LEARNS_WITH["ot_fusion"] = {
    **ONE_SHOT,
    "algorithm.activation_dataset": "embedded",
    "algorithm.activation_root": "embedded",
}
# FedDF distils on unlabelled data; here the training images themselves, without their labels
LEARNS_WITH["feddf"] = {
    **ONE_SHOT,
    "algorithm.distill_source": "dataset",
    "algorithm.distill_dataset": "embedded",
    "algorithm.distill_root": "embedded",
    "algorithm.transfer_pool": "growing",  # the 2-core configs' reading; the whole-set stream runs 10,000 steps
    "algorithm.pool_size": 1000,
}
# The multi-round methods learn on the MLP (a fifth to a tenth of the tiny convnet's seconds); FedBN
# keeps the convnet, whose batch-norm layers are what it keeps local.
ONE_SHOT_NAMES = {"fedavg_oneshot", "ot_fusion", "feddf", "dense", "coboosting", "fedhydra"}
for _name in set(builtin_names()) - ONE_SHOT_NAMES - {"fedbn"}:
    LEARNS_WITH[_name] = {"model.name": "mlp", **LEARNS_WITH.get(_name, {})}
LEARNS_WITH["fedbn"] = {"model.name": "convnet"}  # the tiny runs' default is the MLP
# FedDM condenses a fresh set every round, so at this scale its round 1 can be its best
# (measured: 0.600, 0.532, 0.587); the others build on the previous round.
# FedAvg one-shot and OT fusion combine the models once, in round 1, and keep the result; FedDF's
# round 1 is the clients' average it starts from (measured: 0.821, then 0.801-0.821 while it distils).
# DCFL's round 1 ends its pre-training: the server's model trained on the pooled condensed sets, which
# the next aggregations of alpha-0.1 clients can pull below (measured: 0.579, 0.508, 0.566).
NOT_MONOTONE = {"feddm", "fedavg_oneshot", "ot_fusion", "feddf", "dcfl"}


@pytest.fixture(scope="module")
def client_stage_cache(tmp_path_factory):
    """The one-shot methods below share one client stage (the same clients, models and local
    training): the first trains it, the others read it (tests/test_oneshot.py: the cache changes no
    number). The cache is this module's own folder."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAYSIM_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        yield {"algorithm.cache_client_stage": True}


@pytest.mark.parametrize("name", builtin_names())
def test_every_algorithm_learns(run_tiny, client_stage_cache, name):
    settings = {"rounds": 3, "partition.alpha": 0.1, **LEARNS_WITH.get(name, {}), "algorithm.name": name}
    if "algorithm.cache_client_stage" in settings:
        settings.update(client_stage_cache)
    summary, run_dir = run_tiny(**settings)
    accuracy = server_values(run_dir)
    assert summary["final_accuracy"] > 0.25, accuracy  # chance is 0.1
    if name not in NOT_MONOTONE:
        assert max(accuracy[1:]) > accuracy[0], accuracy


def test_the_readme_lists_every_algorithm():
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| `algorithm.name` |"))
    assert re.findall(r"`([a-z0-9_]+)`", row.split("|")[2]) == builtin_names()


def test_moon_refuses_a_temperature_or_mu_it_cannot_use():
    from raysim.errors import RaysimError
    from raysim.experiment import load_config

    quickstart = Path(__file__).resolve().parents[1] / "configs" / "quickstart.yaml"
    for override, message in (
        ("algorithm.temperature=0", "temperature must be > 0, got 0"),
        ("algorithm.mu=-1", "mu must be >= 0"),
    ):
        with pytest.raises(RaysimError, match=message):
            load_config(quickstart, ["algorithm.name=moon", override])


def _params_classes():
    """Every built-in algorithm's Params and the dataclasses it inherits from."""
    import dataclasses

    from raysim.registry import algorithm_class

    found = {}
    for name in builtin_names():
        for cls in algorithm_class(name).Params.__mro__:
            if dataclasses.is_dataclass(cls):
                found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return found


def test_every_params_is_frozen_and_declares_its_ranges_and_choices():
    """Params are read-only once a config is read (dataclasses.replace makes a changed copy), and a
    range or choice is declared on the field (Bound, Literal), not checked by a validate()."""
    classes = _params_classes()
    assert len(classes) >= 20
    for where, cls in classes.items():
        assert cls.__dataclass_params__.frozen, where
        assert not hasattr(cls, "validate"), where


def test_an_overridden_default_keeps_its_base_declaration():
    """A subclass that changes a field's default repeats its annotation: a Bound or Literal is not
    dropped by the override."""
    import typing

    for where, cls in _params_classes().items():
        hints = typing.get_type_hints(cls, include_extras=True)
        for base in cls.__mro__[1:]:
            if "__dataclass_fields__" not in vars(base):
                continue
            for name, tp in typing.get_type_hints(base, include_extras=True).items():
                assert hints[name] == tp, f"{where}.{name}: {hints[name]} overrides {base.__qualname__}'s {tp}"


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"name": "feddm", "steps": 0}, "algorithm.steps must be >= 1, got 0"),
        ({"name": "dcfl", "server_epochs": -1}, "algorithm.server_epochs must be >= 0, got -1"),
        ({"name": "fedaf", "gamma": 1.5}, r"algorithm.gamma must be in \[0, 1\], got 1.5"),
        ({"name": "dcfl", "filter_ratio": 1}, r"algorithm.filter_ratio must be in \[0, 1\), got 1"),
        ({"name": "dcfl", "pretrain_fraction": 0}, r"algorithm.pretrain_fraction must be in \(0, 1\], got 0"),
        ({"name": "feddyn", "alpha": 0}, "algorithm.alpha must be > 0, got 0"),
        ({"name": "dynafed", "syn_batch": -1}, r"algorithm.syn_batch must be >= 0 \(0: all of D_syn\), got -1"),
        ({"name": "dynafed", "horizon": 30}, "algorithm.horizon .* raise algorithm.trajectory_rounds"),
        ({"name": "fedhydra", "stratify_steps": 1}, r"algorithm.stratify_steps must be >= 2 \(eq. 2"),
        ({"name": "dcfl", "use_condensed": "none", "filter_ratio": 0.5}, "use_condensed: none sends none"),
        ({"name": "dcfl", "mu": 0.1}, "algorithm.mu is not a parameter of base 'fedavg'"),
        ({"name": "fedaf", "swd": "l2"}, "'algorithm.swd' must be one of sum_squared, root_mean, got 'l2'"),
    ],
)
def test_params_refuse_a_value_out_of_range_in_one_line(section, message):
    from raysim.errors import RaysimError
    from raysim.registry import resolve_params

    with pytest.raises(RaysimError, match=message) as caught:
        resolve_params(section)
    assert "\n" not in str(caught.value)


def test_fedhydra_reads_an_aggregation_by_its_former_name():
    from raysim.registry import resolve_params

    assert resolve_params({"name": "fedhydra", "aggregation": "stratified"}).params.aggregation == "stratified_eq8"
