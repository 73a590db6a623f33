from dataclasses import dataclass

import numpy as np
import torch

from raysim.algorithms.fedavg import FedAvg


class FedAvgM(FedAvg):
    summary = "FedAvg with server momentum: v = beta v + (w - mean_k w_k); w = w - v"

    @dataclass
    class Params:
        server_momentum: float = 0.9

    def server_init(self, model, ctx):
        state = super().server_init(model, ctx)
        return {**state, "velocity": {k: np.zeros_like(v) for k, v in state["weights"].items()}}

    def server_update(self, state, replies, round_index, ctx):
        average = self.aggregate(state, replies, ctx)
        beta, weights, velocity = self.params.server_momentum, {}, {}
        for key, w in state["weights"].items():
            if not np.issubdtype(w.dtype, np.floating):  # e.g. BatchNorm's batch counter
                weights[key], velocity[key] = average[key], state["velocity"][key]
                continue
            velocity[key] = beta * state["velocity"][key] + (w - average[key])
            weights[key] = (w - velocity[key]).astype(w.dtype)
        ctx.log.scalar("update_norm", float(np.sqrt(sum((v**2).sum() for v in velocity.values()))))
        return {**state, "weights": weights, "velocity": velocity}


class SmallCNN(torch.nn.Module):
    def __init__(self, in_channels, num_classes, image_size):
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(in_channels, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Flatten()
        )
        self.classifier = torch.nn.Linear(16 * (image_size // 2) ** 2, num_classes)

    def embed(self, x):
        return self.features(x)

    def forward(self, x):
        return self.classifier(self.embed(x))


def small_cnn(in_channels, num_classes, image_size):
    return SmallCNN(in_channels, num_classes, image_size)
