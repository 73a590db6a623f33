"""DynaFed (Pi et al., CVPR 2023): the server synthesizes a small dataset whose training
trajectory matches the global models' (trajectory matching), then fine-tunes the global model
on it.

trajectory  the unrolled trajectory-matching loss and synthesis (eq. 3-4, Algorithm 1)
bench       `raysim bench trajectory`: recomputed vs stored unrolled steps, deterministic mode
"""

from raysim.registry import family_algorithms

# Derived from the modules' classes (each algorithm is named once, by its class's `name`; raysim.registry)
ALGORITHMS = tuple(family_algorithms(__path__))
