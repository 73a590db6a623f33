"""Small helpers the FedAvg family shares: named parameters as tensors, BN keys."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch


def param_names(model: torch.nn.Module) -> list[str]:
    """Trainable parameters (not BatchNorm's running statistics)."""
    return [name for name, _ in model.named_parameters()]


def as_tensors(arrays: Mapping[str, np.ndarray], names: list[str], device: torch.device) -> dict[str, torch.Tensor]:
    return {n: torch.as_tensor(np.asarray(arrays[n]), device=device) for n in names}


def zeros_like_params(model: torch.nn.Module) -> dict[str, np.ndarray]:
    return {n: np.zeros(tuple(p.shape), dtype=np.float32) for n, p in model.named_parameters()}


def batchnorm_keys(model: torch.nn.Module) -> set[str]:
    """State-dict keys of every BatchNorm layer (weights, biases and running statistics)."""
    keys = set()
    for prefix, module in model.named_modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            keys.update(f"{prefix}.{k}" if prefix else k for k in module.state_dict())
    return keys


def squared_distance(model: torch.nn.Module, anchor: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """||w - anchor||^2 over the trainable parameters (FedProx's and FedDyn's proximal term)."""
    return sum(((p - anchor[n]) ** 2).sum() for n, p in model.named_parameters())
