"""Resampling images on a grid (augmentations) and global average pooling, deterministic on CUDA.

CUDA's kernels for the backward passes of `F.grid_sample` and `F.adaptive_avg_pool2d` add into
the input's gradient with atomic adds, so the order of those additions, and with it the last bits
of every gradient that reaches a synthetic image or a generator through an augmentation, changes
from run to run; over thousands of condensation steps the runs part. PyTorch refuses both ops
under `torch.use_deterministic_algorithms(True)`, which raysim turns on for CUDA actors when
`resources.deterministic` is true (`raysim.engine.devices`). In that mode these functions take a
deterministic route: the resampling gathers the (up to four) neighbours of each sampling point,
and a gather's backward has a deterministic CUDA kernel under that flag; the pooling is a mean.
Everywhere else they are `F.grid_sample` and `F.adaptive_avg_pool2d` themselves, so CPU runs keep
their numbers bit for bit.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def deterministic_route(x: torch.Tensor) -> bool:
    return x.is_cuda and torch.are_deterministic_algorithms_enabled()


def grid_sample(
    x: torch.Tensor, grid: torch.Tensor, mode: str = "bilinear", align_corners: bool = False
) -> torch.Tensor:
    """`F.grid_sample(x, grid, mode, padding_mode="zeros", align_corners)`, deterministic on CUDA."""
    if deterministic_route(x):
        return gathered_grid_sample(x, grid, mode, align_corners)
    return F.grid_sample(x, grid, mode=mode, padding_mode="zeros", align_corners=align_corners)


def gathered_grid_sample(
    x: torch.Tensor, grid: torch.Tensor, mode: str = "bilinear", align_corners: bool = False
) -> torch.Tensor:
    """F.grid_sample with zero padding as a sum of gathers: x (N, C, H, W), grid (N, Ho, Wo, 2) in
    [-1, 1] (x then y), mode 'bilinear' or 'nearest'. Equal to it up to float rounding."""
    if mode not in ("bilinear", "nearest"):
        raise ValueError(f"mode must be 'bilinear' or 'nearest', not {mode!r}")
    n, c, h, w = x.shape
    out_shape = (n, c, *grid.shape[1:3])
    gx, gy = grid[..., 0], grid[..., 1]
    # Grid units to pixel coordinates, as grid_sample's unnormalize.
    if align_corners:
        ix, iy = (gx + 1) / 2 * (w - 1), (gy + 1) / 2 * (h - 1)
    else:
        ix, iy = ((gx + 1) * w - 1) / 2, ((gy + 1) * h - 1) / 2
    flat = x.reshape(n, c, h * w)

    def tap(col: torch.Tensor, row: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """weight * x[row, col] per sampling point; points outside the image read zero."""
        inside = (col >= 0) & (col < w) & (row >= 0) & (row < h)
        index = (row.clamp(0, h - 1) * w + col.clamp(0, w - 1)).reshape(n, 1, -1).expand(n, c, -1)
        return flat.gather(2, index) * (weight * inside).reshape(n, 1, -1).to(x.dtype)

    if mode == "nearest":  # grid_sample rounds half to even, as torch.round
        out = tap(ix.round().long(), iy.round().long(), torch.ones_like(ix))
    else:
        x0, y0 = ix.floor(), iy.floor()
        wx1, wy1 = ix - x0, iy - y0
        wx0, wy0 = 1 - wx1, 1 - wy1
        x0, y0 = x0.long(), y0.long()
        out = (
            tap(x0, y0, wx0 * wy0)
            + tap(x0 + 1, y0, wx1 * wy0)
            + tap(x0, y0 + 1, wx0 * wy1)
            + tap(x0 + 1, y0 + 1, wx1 * wy1)
        )
    return out.reshape(out_shape)


class GlobalAvgPool(nn.Module):
    """`nn.AdaptiveAvgPool2d(1)`, deterministic on CUDA (a mean over the spatial dimensions)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if deterministic_route(x):
            return x.mean(dim=(2, 3), keepdim=True)
        return F.adaptive_avg_pool2d(x, 1)
