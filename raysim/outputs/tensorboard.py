"""TensorBoard events: scalars per round, images (partition picture, condensed sets)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch


class TensorBoardLogger:
    def __init__(self, directory: Path, purge_step: int | None = None):
        # lazy: TensorBoard's writer (and the tensorboard package) only for a run that logs to it
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(directory), purge_step=purge_step)

    def scalars(self, round_index: int, values: dict[str, float]) -> None:
        for name, value in values.items():
            self.writer.add_scalar(name, value, round_index)

    def figure(self, tag: str, figure, step: int = 0) -> None:
        self.writer.add_figure(tag, figure, step)

    def image(self, tag: str, image_chw: np.ndarray, step: int) -> None:
        self.writer.add_image(tag, image_chw, step)

    def image_grid(self, tag: str, images: np.ndarray, step: int, nrow: int | None = None) -> None:
        """Images (N, C, H, W) in [0, 1] as one grid picture (nrow per row: e.g. images per class)."""
        # lazy: torchvision takes seconds to import, and only a run that logs pictures needs it
        from torchvision.utils import make_grid

        grid = make_grid(torch.as_tensor(np.asarray(images, dtype=np.float32)), nrow=nrow or 10, padding=1)
        self.writer.add_image(tag, grid.numpy(), step)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
