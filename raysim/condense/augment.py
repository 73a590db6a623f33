"""Differentiable siamese augmentation (DSA; Zhao & Bilen, 2021).

One family is drawn per call (color, crop, cutout, flip, scale, rotate) and
its parameters come from a generator seeded by the caller: calling with the
same seed on the real and the synthetic batch applies the *same* transform to
both, which is what makes matching through augmentation meaningful. Every image
of a batch gets the same transform. All operations are differentiable in the
images (affine grids, masks, arithmetic), so gradients reach synthetic pixels.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

FAMILIES = ("color", "crop", "cutout", "flip", "scale", "rotate")


@dataclass(frozen=True)
class DSAParams:
    flip: float = 0.5          # probability of a horizontal flip
    scale: float = 1.2         # scale factors drawn from [1/scale, scale] per axis
    rotate: float = 15.0       # degrees, +-
    crop: float = 0.125        # translation of up to this fraction of the side
    cutout: float = 0.5        # side of the zeroed square, as a fraction of the image side
    brightness: float = 1.0
    saturation: float = 2.0
    contrast: float = 0.5


class DSA:
    def __init__(self, families: tuple[str, ...] = FAMILIES, params: DSAParams = DSAParams()):
        unknown = set(families) - set(FAMILIES)
        if unknown:
            raise ValueError(f"unknown DSA families {sorted(unknown)}; choose from {FAMILIES}")
        self.families, self.p = tuple(families), params

    def __call__(self, x: torch.Tensor, seed: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed)
        family = self.families[int(torch.randint(len(self.families), (1,), generator=g))]
        return getattr(self, f"_{family}")(x, g)

    @staticmethod
    def _u(g: torch.Generator) -> float:
        return float(torch.rand((), generator=g))

    def _affine(self, x: torch.Tensor, theta: list[list[float]]) -> torch.Tensor:
        t = torch.tensor(theta, dtype=x.dtype, device=x.device).unsqueeze(0).expand(len(x), 2, 3)
        grid = F.affine_grid(t, list(x.shape), align_corners=True)
        return F.grid_sample(x, grid, align_corners=True)

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
        return pad[:, :, abs(dy) + dy: abs(dy) + dy + h, abs(dx) + dx: abs(dx) + dx + w]

    def _cutout(self, x, g):
        h, w = x.shape[2], x.shape[3]
        ch, cw = int(h * self.p.cutout + 0.5), int(w * self.p.cutout + 0.5)
        cy, cx = int(self._u(g) * (h + 1 - ch % 2)), int(self._u(g) * (w + 1 - cw % 2))
        mask = torch.ones(1, 1, h, w, dtype=x.dtype, device=x.device)
        mask[:, :, max(cy - ch // 2, 0): min(cy + ch // 2, h), max(cx - cw // 2, 0): min(cx + cw // 2, w)] = 0
        return x * mask
