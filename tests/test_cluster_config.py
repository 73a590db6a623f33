"""cluster.yaml passes Ray's own cluster-config validation (the launcher's defaults filled in first)."""
from pathlib import Path

import yaml


def test_cluster_yaml_is_valid_for_the_ray_launcher():
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = yaml.safe_load((Path(__file__).resolve().parents[1] / "cluster.yaml").read_text())
    validate_config(prepare_config(config))  # raises on a schema error
    assert config["provider"]["type"] == "aws"
    workers = config["available_node_types"]["gpu_worker"]
    assert workers["min_workers"] < workers["max_workers"]


def test_on_premises_cluster_yaml_is_valid_for_the_ray_launcher():
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = yaml.safe_load((Path(__file__).resolve().parents[1] / "cluster_local.yaml").read_text())
    validate_config(prepare_config(config))
    assert config["provider"]["type"] == "local" and config["provider"]["worker_ips"]
