"""Random crop (zero padding of `pad` pixels, then a crop at the original size) and horizontal flip,
drawn per image: what DENSE, Co-Boosting and FedHydra apply to synthetic images (kornia's
RandomCrop(padding=4) + RandomHorizontalFlip, or torchvision's on the pooled images, in their
code). Done as one integer-shift affine resampling, so gradients reach the generator.

`AUGMENTATIONS` are the modes a method may ask for in a phase (`augment_images`): `crop_flip`,
`flip` (DENSE's pooled MNIST images) and `none`."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from raysim.resample import grid_sample


def crop_flip(x: torch.Tensor, generator: torch.Generator, pad: int = 4, flip: bool = True) -> torch.Tensor:
    """x: (N, C, H, W) pixels in [0, 1]; per image a shift in [-pad, pad]^2 and, with `flip`, a
    horizontal flip with probability 0.5."""
    n, _, h, w = x.shape
    shift = torch.randint(-pad, pad + 1, (n, 2), generator=generator).to(x.device, x.dtype)
    sign = torch.ones(n, device=x.device, dtype=x.dtype)
    if flip:
        sign = torch.where(torch.rand(n, generator=generator).to(x.device) < 0.5, -sign, sign)
    theta = torch.zeros(n, 2, 3, device=x.device, dtype=x.dtype)
    theta[:, 0, 0] = sign
    theta[:, 1, 1] = 1.0
    theta[:, 0, 2] = 2.0 * shift[:, 0] / w  # align_corners=False: one pixel is 2/W in grid units
    theta[:, 1, 2] = 2.0 * shift[:, 1] / h
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    return grid_sample(x, grid, mode="bilinear", align_corners=False)


AUGMENTATIONS = ("crop_flip", "flip", "none")


def augment_images(x: torch.Tensor, mode: str, generator: torch.Generator) -> torch.Tensor:
    """`x` augmented by `mode` (one of AUGMENTATIONS), drawn from `generator`."""
    if mode == "crop_flip":
        return crop_flip(x, generator)
    if mode == "flip":
        flip = (torch.rand(len(x), generator=generator) < 0.5).to(x.device)
        return torch.where(flip[:, None, None, None], x.flip(3), x)
    if mode == "none":
        return x
    raise ValueError(f"unknown augmentation {mode!r}: choose one of {', '.join(AUGMENTATIONS)}")
