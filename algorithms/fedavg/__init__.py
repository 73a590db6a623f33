"""The FedAvg family: FedAvg (McMahan et al., 2017) and the algorithms that change its local
training or aggregation against client drift: FedProx, SCAFFOLD, FedDyn, FedNova, FedBN, MOON,
FedDisco. `from raysim.algorithms.fedavg import FedAvg` is the base most user algorithms extend."""

from raysim.algorithms.fedavg.fedavg import FedAvg

ALGORITHMS = ("fedavg", "fedprox", "scaffold", "feddyn", "fednova", "fedbn", "moon", "feddisco")

__all__ = ["ALGORITHMS", "FedAvg"]
