"""The bottom layer: what a config is, in one package that imports nothing of raysim above it
(tests/test_layout.py checks it):

- files: YAML files and their `extends:` chains, and the configs shipped in the package by name;
- parse: the typed reading of a tree into dataclasses (configs, Params, tables, sweeps) and of
  `key.sub=value` overrides;
- schema: the sections of a config, the resolved (frozen) Config and its checks.

A file or tree plus overrides becomes a validated Config, the algorithm's Params resolved through
the registry, one layer up in raysim.experiment; what `raysim run NAME` accepts (a file, a shipped
name, a table's cell) in raysim.reproduce.named. (load and named here only re-export them for
modules not yet moved to those names.)

The schema's names are importable from here (`from raysim.config import Config`).
"""

from raysim.config.files import merge_trees, read_yaml
from raysim.config.parse import build_dataclass, coerce, parse_override, set_path
from raysim.config.schema import (
    NEUTRAL_KEYS,
    ClientsConfig,
    Config,
    DatasetConfig,
    EvalConfig,
    LocalConfig,
    ModelConfig,
    OutputConfig,
    PartitionConfig,
    ResourcesConfig,
    client_architectures,
    dump_config,
    validate,
)

__all__ = [
    "NEUTRAL_KEYS",
    "ClientsConfig",
    "Config",
    "DatasetConfig",
    "EvalConfig",
    "LocalConfig",
    "ModelConfig",
    "OutputConfig",
    "PartitionConfig",
    "ResourcesConfig",
    "build_dataclass",
    "client_architectures",
    "coerce",
    "dump_config",
    "merge_trees",
    "parse_override",
    "read_yaml",
    "set_path",
    "validate",
]
