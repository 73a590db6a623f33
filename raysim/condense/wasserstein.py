"""Sliced Wasserstein distance (SWD_2) between point sets, differentiable in both."""
from __future__ import annotations

import torch


def _quantiles(sorted_values: torch.Tensor, k: int) -> torch.Tensor:
    """k evenly spaced empirical quantiles of each column of an already sorted (n, L) tensor."""
    n = sorted_values.shape[0]
    if n == k:
        return sorted_values
    idx = ((torch.arange(k, device=sorted_values.device) + 0.5) * n / k).long().clamp_(max=n - 1)
    return sorted_values[idx]


def sliced_wasserstein(x: torch.Tensor, y: torch.Tensor, num_projections: int = 64,
                       generator: torch.Generator | None = None) -> torch.Tensor:
    """SWD_2 between {x_i} (n, d) and {y_j} (m, d).

    Draw L random unit directions, project both sets, sort, compare matching
    quantiles, average the squared differences over points and directions,
    take the square root. For one point on each side it is the distance along
    random directions, ||x - y|| times sqrt(mean cos^2), about ||x - y|| / sqrt(d).
    """
    x, y = x.reshape(len(x), -1), y.reshape(len(y), -1)
    d = x.shape[1]
    theta = torch.randn(d, num_projections, generator=generator).to(x.device, x.dtype)
    theta = theta / theta.norm(dim=0, keepdim=True)
    px, _ = torch.sort(x @ theta, dim=0)
    py, _ = torch.sort(y @ theta, dim=0)
    k = max(len(x), len(y))
    diff = _quantiles(px, k) - _quantiles(py, k)
    return diff.pow(2).mean().clamp_min(1e-12).sqrt()
