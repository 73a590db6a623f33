"""The built-in algorithms, one folder per family; installed as `raysim.algorithms`.

fedavg/     FedAvg and the algorithms that change its local training or aggregation
condensed/  FedDM, FedAF, DCFL: clients condense their data; distribution matching, DSA,
            sliced Wasserstein, CKA
dynafed/    DynaFed: the server synthesizes data by trajectory matching
oneshot/    one communication round: FedAvg one-shot, OT fusion, FedDF, DENSE, Co-Boosting,
            FedHydra; the generator, its losses, ensembles, stratification, OT and the client-stage cache

An algorithm is a module of a family that defines one `Algorithm` subclass whose `name` is the
module's name; that class attribute is the one place the name is written: `raysim.registry` reads
it from the sources to find `algorithm.name: fedavg`, and each family's `ALGORITHMS` is derived
from it (raysim.registry.family_algorithms). The rest of a family's modules are its machinery. Nothing under
raysim's engine, outputs, config, data or models imports from here (tests/test_layout.py).
"""
