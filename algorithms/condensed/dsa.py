"""Differentiable siamese augmentation (DSA; Zhao & Bilen, 2021).

One family is drawn per call (color, crop, cutout, flip, scale, rotate) and
its parameters come from a generator seeded by the caller. Two modes, as in the
DSA authors' `DiffAugment`:
- siamese (the default, for matching): every image of the batch gets the same
  transform, so calling with the same seed on the real and the synthetic batch
  applies the *same* transform to both, which is what makes matching through
  augmentation meaningful;
- per image (`per_image=True`, for *training* on condensed or synthetic data,
  the authors' `seed=-1`): one family per call, its parameters drawn for each
  image, so one batch sees many transforms.
All operations are differentiable in the images (affine grids, masks,
arithmetic), so gradients reach synthetic pixels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from raysim.resample import grid_sample

FAMILIES = ("color", "crop", "cutout", "flip", "scale", "rotate")


@dataclass(frozen=True)
class DSAParams:
    flip: float = 0.5  # probability of a horizontal flip
    scale: float = 1.2  # scale factors drawn from [1/scale, scale] per axis
    rotate: float = 15.0  # degrees, +-
    crop: float = 0.125  # translation of up to this fraction of the side
    cutout: float = 0.5  # side of the zeroed square, as a fraction of the image side
    brightness: float = 1.0
    saturation: float = 2.0
    contrast: float = 0.5


class DSA:
    def __init__(self, families: tuple[str, ...] = FAMILIES, params: DSAParams = DSAParams(), per_image: bool = False):
        unknown = set(families) - set(FAMILIES)
        if unknown:
            raise ValueError(f"unknown DSA families {sorted(unknown)}; choose from {FAMILIES}")
        self.families, self.p, self.per_image = tuple(families), params, per_image

    def __call__(self, x: torch.Tensor, seed: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed)
        family = self.families[int(torch.randint(len(self.families), (1,), generator=g))]
        if self.per_image:
            return getattr(self, f"_{family}_each")(x, g)
        return getattr(self, f"_{family}")(x, g)

    @staticmethod
    def _u(g: torch.Generator) -> float:
        return float(torch.rand((), generator=g))

    def _affine(self, x: torch.Tensor, theta: list[list[float]]) -> torch.Tensor:
        t = torch.tensor(theta, dtype=x.dtype, device=x.device).unsqueeze(0).expand(len(x), 2, 3)
        grid = F.affine_grid(t, list(x.shape), align_corners=True)
        return grid_sample(x, grid, align_corners=True)

    def _scale(self, x, g):
        lo, hi = 1.0 / self.p.scale, self.p.scale
        sx, sy = lo + (hi - lo) * self._u(g), lo + (hi - lo) * self._u(g)
        return self._affine(x, [[sx, 0.0, 0.0], [0.0, sy, 0.0]])

    def _rotate(self, x, g):
        angle = math.radians((self._u(g) - 0.5) * 2 * self.p.rotate)
        c, s = math.cos(angle), math.sin(angle)
        return self._affine(x, [[c, -s, 0.0], [s, c, 0.0]])

    def _flip(self, x, g):
        return x.flip(3) if self._u(g) < self.p.flip else x

    def _color(self, x, g):
        x = x + (self._u(g) - 0.5) * self.p.brightness
        mean = x.mean(dim=1, keepdim=True)
        x = (x - mean) * (self._u(g) * self.p.saturation) + mean
        mean = x.mean(dim=(1, 2, 3), keepdim=True)
        return (x - mean) * (self._u(g) + self.p.contrast) + mean

    def _crop(self, x, g):
        # translate by up to crop * side pixels, zero padding (as DSA's crop)
        h, w = x.shape[2], x.shape[3]
        dx = int(round((self._u(g) * 2 - 1) * self.p.crop * w))
        dy = int(round((self._u(g) * 2 - 1) * self.p.crop * h))
        pad = F.pad(x, (abs(dx), abs(dx), abs(dy), abs(dy)))
        return pad[:, :, abs(dy) + dy : abs(dy) + dy + h, abs(dx) + dx : abs(dx) + dx + w]

    def _cutout(self, x, g):
        h, w = x.shape[2], x.shape[3]
        ch, cw = int(h * self.p.cutout + 0.5), int(w * self.p.cutout + 0.5)
        cy, cx = int(self._u(g) * (h + 1 - ch % 2)), int(self._u(g) * (w + 1 - cw % 2))
        mask = torch.ones(1, 1, h, w, dtype=x.dtype, device=x.device)
        mask[:, :, max(cy - ch // 2, 0) : min(cy + ch // 2, h), max(cx - cw // 2, 0) : min(cx + cw // 2, w)] = 0
        return x * mask

    # ------------------------------------------------------------- per image
    # The same transforms with one draw per image (shape (N,) or (N, 1, 1, 1)).
    @staticmethod
    def _u_each(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        return torch.rand(len(x), generator=g).to(x.device, x.dtype)

    def _affine_each(self, x: torch.Tensor, theta: torch.Tensor, mode: str = "bilinear") -> torch.Tensor:
        grid = F.affine_grid(theta, list(x.shape), align_corners=True)
        return grid_sample(x, grid, mode=mode, align_corners=True)

    def _scale_each(self, x, g):
        lo, hi = 1.0 / self.p.scale, self.p.scale
        sx, sy = lo + (hi - lo) * self._u_each(x, g), lo + (hi - lo) * self._u_each(x, g)
        theta = torch.zeros(len(x), 2, 3, dtype=x.dtype, device=x.device)
        theta[:, 0, 0], theta[:, 1, 1] = sx, sy
        return self._affine_each(x, theta)

    def _rotate_each(self, x, g):
        angle = (self._u_each(x, g) - 0.5) * 2 * math.radians(self.p.rotate)
        c, s = angle.cos(), angle.sin()
        theta = torch.stack(
            [torch.stack([c, -s, torch.zeros_like(c)], 1), torch.stack([s, c, torch.zeros_like(c)], 1)], 1
        )
        return self._affine_each(x, theta)

    def _flip_each(self, x, g):
        flip = (self._u_each(x, g) < self.p.flip).view(-1, 1, 1, 1)
        return torch.where(flip, x.flip(3), x)

    def _color_each(self, x, g):
        shape = (-1, 1, 1, 1)
        x = x + (self._u_each(x, g) - 0.5).view(shape) * self.p.brightness
        mean = x.mean(dim=1, keepdim=True)
        x = (x - mean) * (self._u_each(x, g) * self.p.saturation).view(shape) + mean
        mean = x.mean(dim=(1, 2, 3), keepdim=True)
        return (x - mean) * (self._u_each(x, g) + self.p.contrast).view(shape) + mean

    def _crop_each(self, x, g):
        # whole-pixel translations of up to crop * side, zero fill: nearest sampling on a shifted grid
        h, w = x.shape[2], x.shape[3]
        dx = ((self._u_each(x, g) * 2 - 1) * self.p.crop * w).round()
        dy = ((self._u_each(x, g) * 2 - 1) * self.p.crop * h).round()
        theta = torch.zeros(len(x), 2, 3, dtype=x.dtype, device=x.device)
        theta[:, 0, 0], theta[:, 1, 1] = 1.0, 1.0
        theta[:, 0, 2], theta[:, 1, 2] = -2 * dx / max(w - 1, 1), -2 * dy / max(h - 1, 1)
        return self._affine_each(x, theta, mode="nearest")

    def _cutout_each(self, x, g):
        h, w = x.shape[2], x.shape[3]
        ch, cw = int(h * self.p.cutout + 0.5), int(w * self.p.cutout + 0.5)
        cy = (self._u_each(x, g) * (h + 1 - ch % 2)).long().view(-1, 1, 1)
        cx = (self._u_each(x, g) * (w + 1 - cw % 2)).long().view(-1, 1, 1)
        rows = torch.arange(h, device=x.device).view(1, -1, 1)
        cols = torch.arange(w, device=x.device).view(1, 1, -1)
        inside = (rows >= cy - ch // 2) & (rows < cy + ch // 2) & (cols >= cx - cw // 2) & (cols < cx + cw // 2)
        return x * (~inside).unsqueeze(1).to(x.dtype)
