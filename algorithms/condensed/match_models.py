"""Models to match through: FedAF's re-sampling (eq. 17) and FedDM's samples around the global model."""

from __future__ import annotations

import numpy as np
import torch

from raysim.tensors import load_weights


def _reset_parameters(model: torch.nn.Module, seed: int) -> None:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for module in model.modules():
            if hasattr(module, "reset_parameters") and module is not model:
                module.reset_parameters()


@torch.no_grad()
def resample_model(
    model: torch.nn.Module, scratch: torch.nn.Module, global_weights: dict[str, np.ndarray], gamma: float, seed: int
) -> torch.nn.Module:
    """model <- gamma * w_global + (1 - gamma) * w_random  (FedAF eq. 17).

    w_random is a fresh initialisation (drawn into `scratch` from `seed`);
    BatchNorm running statistics stay the global model's.
    """
    load_weights(model, global_weights)
    if gamma >= 1.0:
        return model
    _reset_parameters(scratch, seed)
    random = dict(scratch.named_parameters())
    for name, p in model.named_parameters():
        p.mul_(gamma).add_(random[name], alpha=1.0 - gamma)
    return model


@torch.no_grad()
def perturb_model(
    model: torch.nn.Module, global_weights: dict[str, np.ndarray], rho: float, generator: torch.Generator
) -> torch.nn.Module:
    """model <- w_global + rho * g / ||g||, g a Gaussian direction (FedDM's sampling at distance rho)."""
    load_weights(model, global_weights)
    params = list(model.parameters())
    noise = [torch.randn(p.shape, generator=generator).to(p.device) for p in params]
    norm = torch.sqrt(sum((n**2).sum() for n in noise))
    for p, n in zip(params, noise):
        p.add_(n, alpha=rho / float(norm))
    return model
