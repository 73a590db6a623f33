"""What a dataset's name promises, and the check that the data read under that name keep it.

A name is a claim about the data: MNIST read as `fashion_mnist` (the same shapes, the same class
count) would otherwise run, and be reported, as Fashion-MNIST. `check_promise` compares what was
read with the name's promise: channels, native image size (when no dataset.image_size resizes it),
number of classes, at most the published image counts (a subset is still that dataset; more
images is another one), and each channel's mean pixel value over the training images.

The pixel mean is what tells same-shaped datasets apart (MNIST 0.131, Fashion-MNIST 0.286; CIFAR-10
0.491 and SVHN 0.438 in the red channel) and it does not depend on the images' order, layout or
resizing. `MEAN_TOLERANCE` is 0.04: the class-stratified embedded sample sits within 0.001 of its
full dataset, the closest pair of different datasets here is 0.054 apart. CINIC-10 (CIFAR-10's
classes, partly CIFAR-10's images) is within the tolerance of CIFAR-10; only its larger image
counts tell the two apart, so CIFAR-10 read as `cinic10` passes.

Data altered on purpose (noise, a class-specific subset) under a known name: dataset.verify=false
skips the check (the data's digest is still recorded in the run, see raysim.data.identity).
"""

from __future__ import annotations

from raysim.data.arrays import ArrayDataset
from raysim.data.records import RECORDS, Promise
from raysim.errors import RaysimError

MEAN_TOLERANCE = 0.04


# What each name promises: its record's shape, class count, image counts and published means.
PROMISES: dict[str, Promise] = {r.name: r.promise for r in RECORDS if r.promise is not None}


def check_promise(dataset: ArrayDataset, name: str, image_size: int | None, where: str) -> None:
    """One line if what was read under `name` (from `where`) is not what the name promises; nothing
    for names without a promise (domainnet: any domains and classes)."""
    promise = PROMISES.get(name)
    if promise is None:
        return
    found = []
    if dataset.channels != promise.channels:
        found.append(f"{dataset.channels} channel(s), not {promise.channels}")
    if image_size is None and dataset.image_size != promise.size:
        found.append(f"{dataset.image_size}x{dataset.image_size} images, not {promise.size}x{promise.size}")
    if dataset.num_classes != promise.classes:
        found.append(f"{dataset.num_classes} classes, not {promise.classes}")
    counts = (("train", len(dataset.train_y), promise.train), ("test", len(dataset.test_y), promise.test))
    for split, count, most in counts:
        if count > most:
            found.append(f"{count:,} {split} images, more than its {most:,}")
    if not found:  # the mean is compared only where the shapes agree (it is meaningless otherwise)
        mean = [float(m) for m in dataset.mean_std()[0]]
        if any(abs(m - p) > MEAN_TOLERANCE for m, p in zip(mean, promise.mean)):
            shown = ", ".join(f"{m:.3f}" for m in mean)
            wanted = ", ".join(f"{p:.3f}" for p in promise.mean)
            found.append(f"mean pixel value {shown}, not {wanted}{_looks_like(mean, dataset, name)}")
    if found:
        raise RaysimError(
            f"the data read as {name} from {where} are not {promise.what}: {'; '.join(found)}. Set dataset.name "
            f"(or dataset.root) to what these data are, or dataset.verify=false if they are {name} altered on purpose"
        )


def _looks_like(mean: list[float], dataset: ArrayDataset, name: str) -> str:
    """' (like mnist)' when another promise fits these data, else ''."""
    for other, p in PROMISES.items():
        fits = (
            other not in (name, "embedded")
            and p.channels == dataset.channels
            and p.classes == dataset.num_classes
            and all(abs(m - q) <= MEAN_TOLERANCE for m, q in zip(mean, p.mean))
        )
        if fits:
            return f" (they look like {other})"
    return ""
