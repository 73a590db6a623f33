"""The DENSE generator (Zhang et al., 2022), used by DENSE, Co-Boosting and FedHydra.

z (nz) -> linear -> BN -> upsample x2 -> conv3x3 (2 ngf) -> BN -> LeakyReLU(0.2) -> upsample x2
-> conv3x3 (ngf) -> BN -> LeakyReLU(0.2) -> conv3x3 (channels) -> sigmoid: images in [0, 1] of the
dataset's size and channels (the size must be divisible by 4: 28 and 32 are).
"""

from __future__ import annotations

import torch
from torch import nn


class Generator(nn.Module):
    def __init__(self, nz: int = 256, ngf: int = 64, image_size: int = 32, channels: int = 3):
        super().__init__()
        if image_size % 4:
            raise ValueError(f"the generator needs an image size divisible by 4, got {image_size}")
        self.nz, self.init_size = nz, image_size // 4
        self.project = nn.Linear(nz, 2 * ngf * self.init_size**2)
        self.body = nn.Sequential(
            nn.BatchNorm2d(2 * ngf),
            nn.Upsample(scale_factor=2),
            nn.Conv2d(2 * ngf, 2 * ngf, 3, padding=1, bias=False),
            nn.BatchNorm2d(2 * ngf),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Upsample(scale_factor=2),
            nn.Conv2d(2 * ngf, ngf, 3, padding=1, bias=False),
            nn.BatchNorm2d(ngf),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ngf, channels, 3, padding=1),
            nn.Sigmoid(),
        )

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        out = self.project(z)
        return self.body(out.view(len(z), -1, self.init_size, self.init_size))


def reset_generator(generator: Generator, seed: int) -> Generator:
    """The authors' re-initialisation (every synthesis, every stratification): conv and linear
    weights N(0, 0.02), biases 0, BN weights N(1, 0.02), BN biases 0; seeded, so runs repeat."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in generator.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                m.weight.copy_(torch.randn(m.weight.shape, generator=g) * 0.02)
                if m.bias is not None:
                    m.bias.zero_()
            elif isinstance(m, nn.BatchNorm2d):
                m.weight.copy_(1.0 + torch.randn(m.weight.shape, generator=g) * 0.02)
                m.bias.zero_()
                m.reset_running_stats()
    return generator
