"""How a config becomes a run's Config, in one package:

- files: YAML files and their `extends:` chains, and the configs shipped in the package by name;
- parse: the typed reading of a tree into dataclasses (configs, Params, tables, sweeps) and of
  `key.sub=value` overrides;
- schema: the sections of a config, the resolved (frozen) Config and its checks;
- load: a file or tree plus overrides -> a validated Config (the algorithm's Params through the
  registry), and the rule that a switched method keeps its own parameters;
- named: what `raysim run NAME` accepts (a file, a shipped name, a table's cell).

The schema's names are importable from here (`from raysim.config import Config`); load and named
are imported from their modules (they need the algorithms and the tables, which import this package).
"""

from raysim.config.files import merge_trees, read_yaml
from raysim.config.parse import build_dataclass, coerce, parse_override, set_path
from raysim.config.schema import (
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
