"""The small Fashion-MNIST sample shipped inside the package (see embedded/README.md)."""

from __future__ import annotations

from pathlib import Path

from raysim.data.parquet import read_parquet_dataset
from raysim.data.source import Source
from raysim.errors import RaysimError

EMBEDDED_DIR = Path(__file__).resolve().parent / "embedded"


def embedded_source(image_size: int | None) -> Source:
    train, test = EMBEDDED_DIR / "train.parquet", EMBEDDED_DIR / "test.parquet"
    missing = [p.name for p in (train, test) if not p.is_file()]
    if missing:
        raise RaysimError(
            f"embedded: {', '.join(missing)} missing from {EMBEDDED_DIR}: reinstall raysim, or rebuild them with "
            f"python -m raysim.data.make_embedded <folder with Fashion-MNIST train.parquet/test.parquet>"
        )
    return Source(
        layout="embedded",
        files=(train, test),
        build=lambda: read_parquet_dataset("embedded", [train], [test], image_size),
        where=str(EMBEDDED_DIR),
    )
