"""The configs shipped inside the package (raysim/configs/), found by name from any folder.

`raysim run quickstart` and `raysim run fedhydra/mnist_2cc_cpu` read raysim/configs/quickstart.yaml and
raysim/configs/fedhydra/mnist_2cc_cpu.yaml; a file path that exists always wins over a shipped name.
"""

from __future__ import annotations

from pathlib import Path

from raysim.errors import RaysimError

ROOT = Path(__file__).resolve().parent / "configs"


def resolve(path_or_name: str | Path) -> Path:
    """An existing file path as given; otherwise the shipped config of that name (`.yaml` optional)."""
    text = str(path_or_name)
    path = Path(text).expanduser()
    if path.is_file():
        return path
    if path.is_dir():
        raise RaysimError(
            f"'{text}' is a folder, not a config file: give a YAML file or a shipped "
            "config's name (list them with 'raysim configs')"
        )
    name = text[: -len(".yaml")] if text.endswith(".yaml") else text
    shipped = (ROOT / f"{name}.yaml").resolve()
    if name and shipped.is_relative_to(ROOT) and shipped.is_file():
        return shipped
    raise RaysimError(
        f"config '{text}' does not exist, neither as a file nor as a shipped config: give "
        "a YAML file's path or a shipped config's name (list them with 'raysim configs')"
    )


def list_configs() -> list[tuple[str, str]]:
    """(name, first comment line or '') of every shipped config, sorted by name."""
    rows = []
    for path in sorted(ROOT.rglob("*.yaml")):
        name = path.relative_to(ROOT).with_suffix("").as_posix()
        if name.startswith("tables/"):  # the papers' tables: `raysim reproduce --list`
            continue
        rows.append((name, _first_comment(path)))
    return sorted(rows)


def _first_comment(path: Path) -> str:
    """The first line of the file's leading comment block, without '#'; '' when it has none."""
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line:
            continue
        return line.lstrip("#").strip() if line.startswith("#") else ""
    return ""
