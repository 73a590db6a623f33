"""Unlabelled images of *another* dataset at the run's shape: FedDF's transfer set and the images on
which OT fusion compares its models' activations.

`auto` picks, for MNIST, Fashion-MNIST; for Fashion-MNIST, MNIST; for CIFAR-10 and CINIC-10,
CIFAR-100 (FedDF's own choice for CIFAR-10); for CIFAR-100 and SVHN, CIFAR-10. An empty root means
the folder of that name beside the run's dataset folder: beside `dataset.root` (../shared/data/mnist
beside ../shared/data/fashion_mnist), or in the data home when dataset.root is unset. The training
images are resized to the run's size (bilinear, antialiased) and converted to its channels (grey
repeated to RGB, RGB to luminance); labels are never read. A run may also name its own dataset (its
training images without their labels: an in-distribution transfer set, which a one-shot server
would not have).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from raysim.data import load_dataset
from raysim.data.home import check_extra_dataset, dataset_folder
from raysim.data.loading import _normalise_name
from raysim.errors import RaysimError

TRANSFER_DATASETS = {
    "mnist": "fashion_mnist",
    "fashion_mnist": "mnist",
    "cifar10": "cifar100",
    "cinic10": "cifar100",
    "cifar100": "cifar10",
    "svhn": "cifar10",
}


def to_shape(images: np.ndarray, size: int, channels: int) -> np.ndarray:
    """(N, H, W, C) uint8 -> (N, channels, size, size) uint8: resized (bilinear, antialiased) and
    converted (grey repeated, or RGB to luminance with ITU-R 601 weights)."""
    x = torch.from_numpy(np.array(images)).permute(0, 3, 1, 2).float()
    if x.shape[1] != channels:
        if channels == 3 and x.shape[1] == 1:
            x = x.repeat(1, 3, 1, 1)
        elif channels == 1 and x.shape[1] == 3:
            x = (x * torch.tensor([0.299, 0.587, 0.114]).view(1, 3, 1, 1)).sum(1, keepdim=True)
        else:
            raise RaysimError(f"cannot convert {x.shape[1]}-channel images to {channels} channels")
    if x.shape[2:] != (size, size):
        x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False, antialias=True)
    return x.round().clamp(0, 255).to(torch.uint8).numpy()


def transfer_source(config, dataset: str, root: str, keys: str) -> tuple[str, str]:
    """(dataset name, folder) of the transfer set given as (`dataset`, `root`); `keys` names the
    config keys that set them, for the errors (e.g. "algorithm.distill_dataset/distill_root")."""

    _normalise_name(config.dataset.name)  # an unknown dataset.name is said as such, not as a missing transfer set
    dataset_key, root_key = keys.split("/")
    name = dataset
    if name == "auto":
        name = TRANSFER_DATASETS.get(config.dataset.name, "")
        if not name:
            raise RaysimError(
                f"{config.algorithm.name} has no default set of unlabelled images for dataset "
                f"{config.dataset.name}: set {dataset_key} and algorithm.{root_key} (e.g. mnist and its folder)"
            )
    if not root:  # beside the dataset's folder: in the data home when dataset.root is unset
        root = str(dataset_folder(config.dataset.name, config.dataset.root).parent / name)
    return name, root


def load_transfer_images(
    name: str, root: str, image_size: int, channels: int, keys: str, verify: bool = True
) -> np.ndarray:
    """The training images of dataset `name` at `root`, as (N, channels, size, size) uint8; `verify`
    (dataset.verify): refuse images that are not what the name promises."""

    check_extra_dataset(name, root, keys)
    dataset_key, root_key = keys.split("/")
    try:
        data = load_dataset(name, root, None, verify=verify)
    except RaysimError as error:
        raise RaysimError(
            f"the unlabelled images ({name} at {root}) cannot be read: set algorithm.{root_key} to their "
            f"folder or {dataset_key} to another dataset ({error})"
        ) from None
    images = np.asarray(data.train_x)
    return np.concatenate(
        [to_shape(images[start : start + 10000], image_size, channels) for start in range(0, len(images), 10000)]
    )
