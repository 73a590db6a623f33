"""Building blocks for condensed/synthetic-data algorithms (FedDM, FedAF, DCFL, DynaFed).

augment      differentiable siamese augmentation (DSA)
matching     distribution-matching loss, class-wise mean logits, soft labels
wasserstein  sliced Wasserstein distance
models       model re-sampling (FedAF eq. 17) and FedDM's rho-ball sampling
synthetic    initialising, quantising and training on condensed sets
"""
