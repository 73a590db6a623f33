"""The FedAvg family: FedAvg (McMahan et al., 2017) and the algorithms that change its local
training or aggregation against client drift: FedProx, SCAFFOLD, FedDyn, FedNova, FedBN, MOON,
FedDisco. `from raysim.algorithms.fedavg import FedAvg` is the base most user algorithms extend."""

from raysim.algorithms.fedavg.fedavg import FedAvg
from raysim.registry import family_algorithms

# Derived from the modules' classes (each algorithm is named once, by its class's `name`; raysim.registry)
ALGORITHMS = tuple(family_algorithms(__path__))

__all__ = ["ALGORITHMS", "FedAvg"]
