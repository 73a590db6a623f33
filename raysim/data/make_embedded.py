"""Build raysim/data/embedded/{train,test}.parquet from Fashion-MNIST in the Hugging Face layout.

    python -m raysim.data.make_embedded /path/to/fashion_mnist    # folder with train.parquet, test.parquet

Takes a class-stratified random sample (fixed seed) of 10,000 train and 2,000
test rows, keeps the original PNG bytes, and writes the rows (in their
original order) plus a README with origin and licence.
"""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

OUT_DIR = Path(__file__).resolve().parent / "embedded"
SEED = 20240601

README = """\
# Embedded dataset: Fashion-MNIST sample

`load_dataset("embedded")` reads these files, so `raysim run` works offline
right after `pip install raysim`.

| file | rows | per class |
|---|---|---|
| `train.parquet` | {n_train:,} | {per_train} |
| `test.parquet` | {n_test:,} | {per_test} |

**Origin.** Fashion-MNIST: Han Xiao, Kashif Rasul, Roland Vollgraf,
"Fashion-MNIST: a Novel Image Dataset for Benchmarking Machine Learning
Algorithms", arXiv:1708.07747 (2017), https://github.com/zalandoresearch/fashion-mnist.
Copyright (c) 2017 Zalando SE, released under the **MIT licence**, which
applies to these files too.

**How it was made.** `python -m raysim.data.make_embedded <fashion_mnist folder>`
(`raysim/data/make_embedded.py`) read the Hugging Face-layout Parquet files of
the full dataset (60,000 train / 10,000 test 28x28 grey PNGs, converted from
the original IDX files) and drew, with `numpy.random.default_rng({seed})`, a
class-stratified random sample without replacement from each split: the same
number of images per class, in the original row order. Rows are copied
unchanged (original PNG bytes, original `path`, `label` 0-9).

Layout: an `image` column `struct<bytes: binary, path: string>` and an int64
`label` column. Labels 0-9 are: T-shirt/top, Trouser, Pullover, Dress, Coat,
Sandal, Shirt, Sneaker, Bag, Ankle boot.

Source files (sha256): train {sha_train}, test {sha_test}.
"""


def stratified_indices(labels: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """n row indices, each class getting its proportional share (largest remainder), sorted."""
    classes, counts = np.unique(labels, return_counts=True)
    share = counts * n / counts.sum()
    take = np.floor(share).astype(int)
    for i in np.argsort(-(share - take), kind="stable")[: n - take.sum()]:
        take[i] += 1
    picked = [rng.choice(np.flatnonzero(labels == c), size=k, replace=False) for c, k in zip(classes, take)]
    return np.sort(np.concatenate(picked))


def sample_split(src: Path, dst: Path, n: int, rng: np.random.Generator) -> np.ndarray:
    table = pq.read_table(src)
    labels = table.column("label").to_numpy()
    idx = stratified_indices(labels, n, rng)
    pq.write_table(table.take(idx), dst, compression="zstd", compression_level=19)
    return np.bincount(labels[idx])


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source", type=Path, help="folder holding Fashion-MNIST train.parquet and test.parquet")
    ap.add_argument("--out", type=Path, default=OUT_DIR)
    ap.add_argument("--train", type=int, default=10_000)
    ap.add_argument("--test", type=int, default=2_000)
    ap.add_argument("--seed", type=int, default=SEED)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    src_train, src_test = args.source / "train.parquet", args.source / "test.parquet"
    per_train = sample_split(src_train, args.out / "train.parquet", args.train, rng)
    per_test = sample_split(src_test, args.out / "test.parquet", args.test, rng)
    fmt = lambda c: ", ".join(str(int(v)) for v in c) if len(set(c.tolist())) > 1 else str(int(c[0]))  # noqa: E731
    (args.out / "README.md").write_text(
        README.format(
            n_train=args.train,
            n_test=args.test,
            per_train=fmt(per_train),
            per_test=fmt(per_test),
            seed=args.seed,
            sha_train=sha256(src_train),
            sha_test=sha256(src_test),
        )
    )
    for f in ("train.parquet", "test.parquet"):
        print(f"{args.out / f}: {(args.out / f).stat().st_size / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
