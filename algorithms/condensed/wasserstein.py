"""Sliced Wasserstein distance between point sets, differentiable in both.

Draw L random unit directions, project both sets, sort, compare matching quantiles. The
conventions differ in how the per-direction squared gaps are reduced:
- `squared=False, over_projections="mean"`: SWD_2 = sqrt(mean over directions and quantiles),
  POT's `sliced_wasserstein_distance`. For one point on each side it is ||x - y|| sqrt(mean cos^2),
  about ||x - y|| / sqrt(d), and its gradient has norm about 1 / sqrt(d) whatever the distance.
- `squared=True, over_projections="sum"`: the sum over directions of the mean squared quantile gap
  (SW_2^2 times L, the SWAE loss summed rather than averaged over directions). For one point on each
  side it is about (L / d) ||x - y||^2: a squared distance, whose gradient grows with the gap.
"""

from __future__ import annotations

import torch


def _quantiles(sorted_values: torch.Tensor, k: int) -> torch.Tensor:
    """k evenly spaced empirical quantiles of each column of an already sorted (n, L) tensor."""
    n = sorted_values.shape[0]
    if n == k:
        return sorted_values
    idx = ((torch.arange(k, device=sorted_values.device) + 0.5) * n / k).long().clamp_(max=n - 1)
    return sorted_values[idx]


def sliced_wasserstein(
    x: torch.Tensor,
    y: torch.Tensor,
    num_projections: int = 64,
    generator: torch.Generator | None = None,
    squared: bool = False,
    over_projections: str = "mean",
) -> torch.Tensor:
    """Sliced Wasserstein distance between {x_i} (n, d) and {y_j} (m, d) (see the module docstring)."""
    if over_projections not in ("mean", "sum"):
        raise ValueError(f"over_projections must be mean or sum, got {over_projections!r}")
    x, y = x.reshape(len(x), -1), y.reshape(len(y), -1)
    d = x.shape[1]
    theta = torch.randn(d, num_projections, generator=generator).to(x.device, x.dtype)
    theta = theta / theta.norm(dim=0, keepdim=True)
    px, _ = torch.sort(x @ theta, dim=0)
    py, _ = torch.sort(y @ theta, dim=0)
    k = max(len(x), len(y))
    per_direction = (_quantiles(px, k) - _quantiles(py, k)).pow(2).mean(0)
    total = per_direction.mean() if over_projections == "mean" else per_direction.sum()
    return total if squared else total.clamp_min(1e-12).sqrt()
