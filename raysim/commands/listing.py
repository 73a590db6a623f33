"""`raysim algorithms`, `raysim datasets` and `raysim configs`: what raysim ships."""

from __future__ import annotations

import argparse

from raysim.config import dump_config
from raysim.config.files import list_configs, resolve
from raysim.data import describe_datasets
from raysim.experiment import load_config
from raysim.models import describe_models
from raysim.registry import describe_algorithms


def algorithms(args: argparse.Namespace) -> int:

    for name, text in describe_algorithms():
        print(f"{name:12s} {text}")
    return 0


def configs(args: argparse.Namespace) -> int:

    if args.config:  # the whole config a run would use: its extends: chain, the overrides and the defaults
        print(dump_config(load_config(resolve(args.config), args.overrides)), end="")
        return 0
    rows = list_configs()
    width = max(len(name) for name, _ in rows)
    for name, text in rows:
        print(f"{name:{width}s}  {text}".rstrip())
    return 0


def datasets(args: argparse.Namespace) -> int:
    print("datasets (dataset.name):")
    for name, text in describe_datasets():
        print(f"  {name:14s} {text}")
    print("models (model.name):")
    for name, text in describe_models():
        print(f"  {name:14s} {text}")
    return 0
