"""Data-free knowledge transfer from client models to a server model (the one-shot family).

Shared by DENSE, Co-Boosting and FedHydra (and FedDF's generator source):
- `generator`: the DENSE generator (z -> image in [0, 1]) and its re-initialisation;
- `losses`: BN-statistics loss over every teacher with BN layers, the adversarial loss, the
  hard-sample-weighted cross-entropy, the distillation (KL) loss, ODS input perturbation;
- `ensemble`: combiners of the client models' logits (mean, learned per-client weights,
  FedHydra's stratified aggregation) and FedHydra's model stratification;
- `pool`: the capped pool of synthetic images with their target labels;
- `augment`: the random crop + flip the authors apply to synthetic images;
- `datafree`: one synthesis step (train a fresh generator, keep its best batch) and one
  distillation epoch over the pool.
"""
