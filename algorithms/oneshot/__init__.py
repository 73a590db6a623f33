"""The one-shot family: one round of client training, then the server builds its model alone.
FedAvg one-shot, OT fusion (Singh and Jaggi, 2020), FedDF (Lin et al., 2020), DENSE (Zhang et
al., 2022), Co-Boosting (Dai et al., 2024) and FedHydra.

base          what the six share: the client stage, the server's distillation loop, evaluation
client_cache  the disk cache of the client stage, so the six train the clients once per setting
transfer      unlabelled images of another dataset (FedDF's transfer set, OT's activations)
fusion        optimal-transport model fusion (weights or activations)
generator     the DENSE generator (z -> image in [0, 1]) and its re-initialisation
losses        BN-statistics, adversarial, hard-sample-weighted, KL losses; ODS perturbation
ensemble      combiners of the client models' logits (mean, learned weights, FedHydra's)
stratify      FedHydra's model stratification (Algorithm 2, eq. 1-3)
augment       the random crop + flip the authors apply to synthetic images
datafree      one synthesis step and one distillation epoch over the synthetic pool
"""

from raysim.registry import family_algorithms

# Derived from the modules' classes (each algorithm is named once, by its class's `name`; raysim.registry)
ALGORITHMS = tuple(family_algorithms(__path__))
