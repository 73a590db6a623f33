"""The condensed-data family: clients condense their data and upload the condensed sets; the
server trains on their union. FedDM (Xiong et al., CVPR 2023), FedAF (Wang et al., CVPR 2024),
DCFL (Wang et al., 2024).

condensation  what FedDM and FedAF share (condense on clients, train on the union on the server)
dsa           differentiable siamese augmentation (DSA)
matching      distribution-matching loss, class-wise mean logits, soft labels
match_models  the models to match through: FedAF's re-sampling (eq. 17), FedDM's rho-ball samples
synthetic     initialising, quantising and training on condensed sets
wasserstein   sliced Wasserstein distance (FedAF's local-global regulariser)
similarity    linear CKA and Spearman correlation (DCFL's client similarity and its diagnostics)
bench         `raysim bench condense`: batched vs per-class DM steps
"""

from raysim.registry import family_algorithms

# Derived from the modules' classes (each algorithm is named once, by its class's `name`; raysim.registry)
ALGORITHMS = tuple(family_algorithms(__path__))
