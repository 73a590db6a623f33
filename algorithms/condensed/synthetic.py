"""Condensed sets: initialisation, uint8 transport, and training a model on them."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from raysim.algorithms.condensed.dsa import DSA
from raysim.training import even_batches, train


def init_synthetic(
    real: torch.Tensor, ipc: int, generator: torch.Generator, mode: str = "real", average_of: int = 10
) -> torch.Tensor:
    """`ipc` initial images for one class from its real images (n, C, H, W).

    real:    ipc distinct random real images (with replacement if n < ipc);
    average: FedAF's class-wise averages of random real images: each a weighted mean of
             k = min(average_of, n) distinct random real images, the weights drawn from a flat
             Dirichlet (a random point of the simplex). Plain equal weights would give a class
             with n <= average_of images ipc copies of its one mean, which nothing in the
             matching loss can tell apart, so they stay identical for the whole run (19-43% of
             (client, class) cells at the FedAF paper's alphas); random weights make every
             initial image distinct as soon as the class has two different images, and each is
             still an average of real images, equal to the class mean in expectation;
    noise:   standard normal pixels (in normalised space).
    """
    n = len(real)
    if mode == "noise":
        return torch.randn((ipc, *real.shape[1:]), generator=generator).to(real.device)
    if mode == "real":
        idx = (
            torch.randperm(n, generator=generator)[:ipc] if n >= ipc else torch.randint(n, (ipc,), generator=generator)
        )
        return real[idx.to(real.device)].clone()
    if mode == "average":
        k = max(1, min(average_of, n))
        idx = torch.stack([torch.randperm(n, generator=generator)[:k] for _ in range(ipc)])
        # Flat Dirichlet weights as normalised standard exponentials (drawn from `generator`).
        weights = -torch.rand(ipc, k, generator=generator).clamp_min(1e-12).log()
        weights = (weights / weights.sum(1, keepdim=True)).to(real.device, real.dtype)
        return torch.einsum("ik,ik...->i...", weights, real[idx.to(real.device)])
    raise ValueError(f"unknown initialisation '{mode}': use real, average or noise")


def quantize(images: torch.Tensor, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """Normalised float images (N, C, H, W) -> uint8 pixels: one byte per pixel and channel."""
    m = torch.as_tensor(mean, dtype=images.dtype, device=images.device).view(1, -1, 1, 1)
    s = torch.as_tensor(std, dtype=images.dtype, device=images.device).view(1, -1, 1, 1)
    pixels = (images.detach() * s + m).clamp(0, 1).mul(255).round()
    return pixels.to(torch.uint8).cpu().numpy()


def dequantize(pixels: np.ndarray, mean: np.ndarray, std: np.ndarray, device: torch.device) -> torch.Tensor:
    x = torch.from_numpy(np.array(pixels)).to(device).float().div_(255)
    m = torch.as_tensor(mean, dtype=torch.float32, device=device).view(1, -1, 1, 1)
    s = torch.as_tensor(std, dtype=torch.float32, device=device).view(1, -1, 1, 1)
    return (x - m) / s


def as_images(images: np.ndarray, mean: np.ndarray, std: np.ndarray, device: torch.device) -> torch.Tensor:
    """Condensed images as they travelled (uint8 pixels or float32 normalised) -> normalised tensors."""
    images = np.asarray(images)
    if images.dtype == np.uint8:
        return dequantize(images, mean, std, device)
    return torch.from_numpy(np.array(images)).to(device)


def set_labels(classes: np.ndarray, count: int) -> np.ndarray:
    """The labels of a condensed set of `count` images stored class by class, equally many each."""
    return np.repeat(np.asarray(classes), count // len(classes)).astype(np.int64)


def to_pixels(images: torch.Tensor | np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """Images as float [0, 1] (N, C, H, W) for pictures, whatever form they travel in."""
    if isinstance(images, np.ndarray) and images.dtype == np.uint8:
        return images.astype(np.float32) / 255
    images = torch.as_tensor(np.asarray(images)) if isinstance(images, np.ndarray) else images
    return quantize(images.float(), mean, std).astype(np.float32) / 255


ExtraLoss = Callable[[torch.nn.Module, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def train_on_synthetic(
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    epochs: int,
    batch_size: int,
    lr: float,
    momentum: float,
    generator: torch.Generator,
    augment: DSA | None = None,
    extra_loss: ExtraLoss | None = None,
    weight_decay: float = 0.0,
) -> float:
    """Cross-entropy training on a condensed set in even batches (+ `extra_loss(model, xb, yb, logits)`);
    returns the last epoch's loss."""

    def loss_fn(model: torch.nn.Module, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        logits = model(xb)
        loss = F.cross_entropy(logits, yb)
        return loss if extra_loss is None else loss + extra_loss(model, xb, yb, logits)

    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
    return train(
        model,
        x,
        y,
        epochs=epochs,
        batch_size=batch_size,
        optimizer=optimizer,
        generator=generator,
        loss_fn=loss_fn,
        augment=augment,
        split=even_batches,
    ).last_epoch_loss
