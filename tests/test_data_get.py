"""`raysim data get` end to end without the internet: small archives of the real formats, made here,
served from a local mirror on the loopback address; the catalogue's checksums are replaced by
theirs (the real ones name the real archives), everything else (files, layout) is the catalogue's."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import signal
import struct
import subprocess
import sys
import threading
import time
from dataclasses import replace
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from raysim.data import catalogue, records
from tests.conftest import tiny_overrides

ROOT = Path(__file__).resolve().parents[1]


class RangeHandler(SimpleHTTPRequestHandler):
    """A static file server that honours `Range: bytes=N-` (as web servers do) and can be slowed."""

    delay_s = 0.0  # per 4 kB sent
    ranges: list[str] = []

    def log_message(self, *args):  # quiet
        pass

    def do_GET(self):
        path = Path(self.translate_path(self.path))
        if not path.is_file():
            self.send_error(404)
            return
        data = path.read_bytes()
        start = 0
        asked = self.headers.get("Range")
        if asked:
            self.ranges.append(asked)
            start = int(asked.removeprefix("bytes=").split("-")[0])
            if start >= len(data):
                self.send_error(416)
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(len(data) - start))
        self.end_headers()
        for offset in range(start, len(data), 4096):
            self.wfile.write(data[offset : offset + 4096])
            self.wfile.flush()
            time.sleep(self.delay_s)


@pytest.fixture
def mirror(tmp_path):
    """(base URL, the folder it serves, the handler class): a mirror on 127.0.0.1."""
    served = tmp_path / "mirror"
    served.mkdir()
    handler = type("Handler", (RangeHandler,), {"ranges": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(handler, directory=str(served)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", served, handler
    server.shutdown()
    server.server_close()


def mnist_archives(folder: Path, train: int = 300, test: int = 60) -> dict[str, np.ndarray]:
    """MNIST's four .gz files in IDX format (MNIST-like pixels: about 13% ink), as the mirror serves
    them under mnist/; returns the arrays they hold."""
    rng = np.random.default_rng(0)
    arrays = {
        "train_x": ((rng.random((train, 28, 28)) < 0.13) * 255).astype(np.uint8),
        "train_y": (np.arange(train) % 10).astype(np.uint8),
        "test_x": ((rng.random((test, 28, 28)) < 0.13) * 255).astype(np.uint8),
        "test_y": (np.arange(test) % 10).astype(np.uint8),
    }
    folder.mkdir(parents=True, exist_ok=True)
    for prefix, split in (("train", "train"), ("t10k", "test")):
        x, y = arrays[f"{split}_x"], arrays[f"{split}_y"]
        images = struct.pack(">iiii", 0x803, *x.shape) + x.tobytes()
        labels = struct.pack(">ii", 0x801, len(y)) + y.tobytes()
        (folder / f"{prefix}-images-idx3-ubyte.gz").write_bytes(gzip.compress(images, mtime=0))
        (folder / f"{prefix}-labels-idx1-ubyte.gz").write_bytes(gzip.compress(labels, mtime=0))
    return arrays


def checksums_of(folder: Path) -> dict[str, str]:
    return {f.name: "md5:" + hashlib.md5(f.read_bytes()).hexdigest() for f in folder.iterdir()}


def with_checksums(name: str, checksums: dict[str, str]) -> catalogue.Entry:
    """The catalogue's entry for `name` with these files' checksums (its files and layout unchanged)."""
    real = catalogue.entry(name)
    return replace(real, archives=tuple(replace(a, checksum=checksums[a.file]) for a in real.archives))


@pytest.fixture
def served_mnist(mirror, monkeypatch, tmp_path):
    """MNIST archives on the mirror, the catalogue taking their checksums, and an empty data home."""
    base, served, handler = mirror
    arrays = mnist_archives(served / "mnist")
    sums = checksums_of(served / "mnist")
    fake = with_checksums("mnist", sums)
    monkeypatch.setattr("raysim.data.get.entry", lambda name: fake)
    home = tmp_path / "home"
    monkeypatch.setenv("RAYSIM_DATA", str(home))
    return base, served, handler, home, arrays, sums


@pytest.mark.slow  # a whole (tiny) run on the result
def test_data_get_from_a_mirror_puts_the_dataset_where_a_run_finds_it(served_mnist, capsys):
    from raysim.cli import main
    from raysim.data import clear_memory_cache, load_dataset

    base, _, _, home, arrays, _ = served_mnist
    assert main(["data", "get", "mnist", "--mirror", base]) == 0
    assert "mnist: got in" in capsys.readouterr().out
    raw = home / "mnist" / "MNIST" / "raw"
    assert sorted(p.name for p in raw.iterdir()) == sorted(
        ["train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"]
    )  # torchvision's layout, unpacked
    assert sorted(p.name for p in home.iterdir()) == ["mnist"]  # the downloads are gone
    clear_memory_cache()
    ds = load_dataset("mnist")  # no root: the data home
    assert np.array_equal(ds.train_x[..., 0], arrays["train_x"]) and ds.test_y.tolist() == arrays["test_y"].tolist()
    assert main(["data", "get", "mnist", "--mirror", base]) == 0  # again: nothing to do
    assert "mnist: already in" in capsys.readouterr().out

    overrides = tiny_overrides(**{"dataset.name": "mnist", "resources.in_process": True, "rounds": 1})
    assert main(["run", str(ROOT / "configs" / "quickstart.yaml"), *overrides, "--out", str(home.parent / "run")]) == 0
    recorded = json.loads((home.parent / "run" / "data.json").read_text())
    assert (recorded["name"], recorded["train"], recorded["test"]) == ("mnist", 300, 60)


@pytest.mark.parametrize("damage", ["a changed byte", "truncated"])
def test_a_mirror_serving_a_damaged_archive_is_one_line_and_leaves_nothing(served_mnist, capsys, damage):
    from raysim.cli import main

    base, served, _, home, _, _ = served_mnist
    archive = served / "mnist" / "train-images-idx3-ubyte.gz"
    data = archive.read_bytes()
    middle = len(data) // 2
    archive.write_bytes(
        data[:middle] + bytes([data[middle] ^ 1]) + data[middle + 1 :] if damage == "a changed byte" else data[:middle]
    )
    assert main(["data", "get", "mnist", "--mirror", base]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "train-images-idx3-ubyte.gz from http://127.0.0.1" in err
    assert "does not match its md5 checksum" in err and "run the command again" in err
    assert not home.exists() or list(home.iterdir()) == []


@pytest.mark.parametrize(
    "args, words",
    [
        (["get", "imagenet"], "raysim cannot download 'imagenet': choose among mnist, fashion_mnist"),
        (["get"], "name the datasets to get"),
        (["get", "mnist", "--mirror", "ftp://x"], "mirror 'ftp://x' is not a URL"),
        (["get", "mnist", "--mirror", "http://127.0.0.1:9"], "cannot download train-images-idx3-ubyte.gz"),
        (["list", "mnist"], "takes no names"),
    ],
)
def test_bad_requests_are_one_line_and_exit_2(args, words, capsys, tmp_path, monkeypatch):
    from raysim.cli import main

    monkeypatch.setenv("RAYSIM_DATA", str(tmp_path / "home"))
    assert main(["data", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and words in err, err


def test_a_full_disk_is_one_line_and_the_downloads_are_kept(served_mnist, capsys, monkeypatch):
    import errno

    from raysim.cli import main

    base, _, _, home, _, _ = served_mnist
    real = __import__("raysim.data.download", fromlist=["_download"])._download
    calls = []

    def fills_up(url, part, label, bar, deadline=None):  # the third archive meets a full disk
        calls.append(url)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(url, part, label, bar)

    monkeypatch.setattr("raysim.data.download._download", fills_up)
    assert main(["data", "get", "mnist", "--mirror", base]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "no space left on device while downloading" in err and "run the same command" in err
    assert not (home / "mnist").exists() and len(list((home / ".incoming" / "mnist").glob("*.gz"))) == 2
    monkeypatch.setattr("raysim.data.download._download", real)
    assert main(["data", "get", "mnist", "--mirror", base]) == 0  # goes on: two archives left to get


PATCHED_CLI = """
import json, os, sys
from dataclasses import replace
from raysim.data import catalogue
real = catalogue.entry("mnist")
sums = json.loads(os.environ["TEST_CHECKSUMS"])
fake = replace(real, archives=tuple(replace(a, checksum=sums[a.file]) for a in real.archives))
import raysim.data.get
raysim.data.get.entry = lambda name: fake
from raysim.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow  # a download in a subprocess, killed
def test_a_killed_download_leaves_no_dataset_and_the_next_get_resumes_it(served_mnist, tmp_path):
    from raysim.cli import main

    base, served, handler, home, _, sums = served_mnist
    big = served / "mnist" / "train-images-idx3-ubyte.gz"
    assert big.stat().st_size > 4 * 4096  # long enough to be killed half way
    handler.delay_s = 0.3
    env = {**os.environ, "TEST_CHECKSUMS": json.dumps(sums), "RAYSIM_DATA": str(home)}
    proc = subprocess.Popen(
        [sys.executable, "-c", PATCHED_CLI, "data", "get", "mnist", "--mirror", base],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    part = home / ".incoming" / "mnist" / "train-images-idx3-ubyte.gz.part"
    deadline = time.time() + 60
    while not (part.exists() and part.stat().st_size >= 2 * 4096):
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    had = part.stat().st_size
    assert 0 < had < big.stat().st_size and not (home / "mnist").exists()

    handler.delay_s = 0.0
    assert main(["data", "get", "mnist", "--mirror", base]) == 0
    assert f"bytes={had}-" in handler.ranges  # asked only for the rest
    assert (home / "mnist" / "MNIST" / "raw" / "train-images-idx3-ubyte").stat().st_size == 16 + 300 * 28 * 28


def test_data_list_names_every_dataset_the_tables_read(capsys):
    from raysim.algorithms.oneshot.transfer import transfer_source
    from raysim.cli import main
    from raysim.experiment import config_from_dict
    from raysim.reproduce.table_file import list_tables

    read = set()
    for table in list_tables():  # every run's dataset and transfer set, through its config
        for cell, c in table.cells.items():
            for method in table.methods:
                config = config_from_dict(table.config_tree(cell, method, next(iter(c.config)), 0, "/data"))
                read.add(config.dataset.name)
                p = config.algorithm.params
                if getattr(p, "distill_source", None) == "dataset":  # FedDF's transfer set
                    read.add(transfer_source(config, p.distill_dataset, "", "k/k")[0])
                if getattr(p, "alignment", None) == "activations":  # OT fusion's
                    read.add(transfer_source(config, p.activation_dataset, "", "k/k")[0])
    assert main(["data", "list"]) == 0
    listed = {line.split()[0] for line in capsys.readouterr().out.splitlines()[2:]}
    assert read - {"embedded"} <= listed, read - listed
    assert {"svhn", "cifar100"} <= read  # the tables' datasets raysim could not get before


def cinic10_archive(folder: Path) -> None:
    """CINIC-10.tar.gz as the authors pack it: train/, valid/, test/ at its top, a folder of PNGs per class."""
    import io
    import tarfile

    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    with tarfile.open(folder / "CINIC-10.tar.gz", "w:gz") as tar:
        for split in ("train", "valid", "test"):
            for label, cls in enumerate(("airplane", "automobile")):
                for i in range(2):
                    buf = io.BytesIO()
                    Image.new("RGB", (32, 32), (100 * label, 90, 70)).save(buf, format="PNG")
                    info = tarfile.TarInfo(f"{split}/{cls}/cifar-10-{split}-{i}.png")
                    info.size = len(buf.getvalue())
                    tar.addfile(info, io.BytesIO(buf.getvalue()))


def domainnet_archives(folder: Path) -> None:
    """Two domains' zips (<domain>/<class>/<image>.jpg) and their split lists, as the release has them."""
    import io
    import zipfile

    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    for domain, _, *_ in records.DOMAINNET_RELEASE:
        lists = {"train": [], "test": []}
        with zipfile.ZipFile(folder / f"{domain}.zip", "w") as z:
            for label, cls in enumerate(("apple", "bus")):
                for i in range(3):
                    buf = io.BytesIO()
                    Image.new("RGB", (12, 12), (40 * label, 80, 120)).save(buf, format="JPEG")
                    z.writestr(f"{domain}/{cls}/{domain}_{i}.jpg", buf.getvalue())
                    lists["test" if i == 2 else "train"].append(f"{domain}/{cls}/{domain}_{i}.jpg {label}")
        for split, lines in lists.items():
            (folder / f"{domain}_{split}.txt").write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("name", ["cinic10", "domainnet"])
def test_each_kind_of_archive_unpacks_into_a_layout_raysim_reads(name, mirror, monkeypatch, tmp_path, capsys):
    from raysim.cli import main
    from raysim.data import load_dataset

    base, served, _ = mirror
    (cinic10_archive if name == "cinic10" else domainnet_archives)(served / name)
    fake = with_checksums(
        name, {f.name: "sha256:" + hashlib.sha256(f.read_bytes()).hexdigest() for f in (served / name).iterdir()}
    )
    monkeypatch.setattr("raysim.data.get.entry", lambda n: fake)
    home = tmp_path / "home"
    assert main(["data", "get", name, "--root", str(home), "--mirror", base]) == 0
    ds = load_dataset(name, home / name, verify=False)
    if name == "cinic10":  # a tar of image folders
        assert ds.train_x.shape == (4, 32, 32, 3) and ds.test_x.shape == (4, 32, 32, 3)
    else:  # the split lists sort each domain's images into train/ and test/
        assert len(ds.domains) == 6 and ds.classes == ["apple", "bus"]
        assert len(ds.train_y) == 6 * 4 and len(ds.test_y) == 6 * 2
    assert sorted(p.name for p in home.iterdir()) == [name]


def test_an_archive_whose_members_point_outside_its_folder_is_refused(mirror, monkeypatch, tmp_path, capsys):
    import io
    import tarfile

    from raysim.cli import main

    base, served, _ = mirror
    (served / "cifar10").mkdir()
    with tarfile.open(served / "cifar10" / "cifar-10-python.tar.gz", "w:gz") as tar:
        info = tarfile.TarInfo("../../escaped.txt")
        info.size = 5
        tar.addfile(info, io.BytesIO(b"owned"))
    archive = served / "cifar10" / "cifar-10-python.tar.gz"
    fake = with_checksums("cifar10", {archive.name: "md5:" + hashlib.md5(archive.read_bytes()).hexdigest()})
    monkeypatch.setattr("raysim.data.get.entry", lambda n: fake)
    home = tmp_path / "a" / "b" / "home"
    assert main(["data", "get", "cifar10", "--root", str(home), "--mirror", base]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "cifar-10-python.tar.gz passed its checksum but cannot be unpacked" in err
    assert not list(tmp_path.rglob("escaped.txt")) and not (home / "cifar10").exists()


def test_a_file_that_fails_its_checksum_at_one_location_is_fetched_from_the_next(mirror, tmp_path):
    from raysim.data.download import ChecksumMismatch, fetch

    base, served, _ = mirror
    good = b"the archive" * 1000
    (served / "one").mkdir()
    (served / "two").mkdir()
    (served / "one" / "a.gz").write_bytes(good[:-1] + b"!")  # a first mirror serving another file
    (served / "two" / "a.gz").write_bytes(good)
    checksum = "sha256:" + hashlib.sha256(good).hexdigest()
    fetch([f"{base}/one/a.gz", f"{base}/two/a.gz"], tmp_path / "a.gz", checksum, "a", bar=False)
    assert (tmp_path / "a.gz").read_bytes() == good and not (tmp_path / "a.gz.part").exists()
    with pytest.raises(ChecksumMismatch, match=r"b.gz from .*/one/a.gz does not match its sha256 checksum"):
        fetch([f"{base}/one/a.gz"], tmp_path / "b.gz", checksum, "b", bar=False)
    assert not list(tmp_path.glob("b.gz*"))
