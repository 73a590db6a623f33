"""Datasets as uint8 numpy arrays: the embedded sample, Parquet (Hugging Face), torchvision roots, image folders.

    ds = load_dataset("mnist", "/path/to/mnist")      # layout of the root detected automatically
    ds.train_x  # uint8 (N, H, W, C), read-only;  ds.train_y  # int64 (N,)

Decoded arrays are cached under $RAYSIM_CACHE_DIR (default ~/.cache/raysim) and
memoised in-process, both keyed by the source files' content (a SHA-256 of their bytes,
not their size and mtime); see raysim.data.cache.
"""

from raysim.data.arrays import ArrayDataset
from raysim.data.cache import clear_memory_cache
from raysim.data.loading import DATASET_NAMES, describe_datasets, load_dataset

__all__ = ["ArrayDataset", "DATASET_NAMES", "clear_memory_cache", "describe_datasets", "load_dataset"]
