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


ROOT = Path(__file__).resolve().parents[1]
CLUSTER_FILES = ("cluster.yaml", "cluster_local.yaml")


def test_dashboard_and_job_api_listen_on_the_heads_localhost_only():
    for name in CLUSTER_FILES:
        config = yaml.safe_load((ROOT / name).read_text())
        head = " ".join(config["head_start_ray_commands"])
        assert "--dashboard-host=127.0.0.1" in head, name
        assert "0.0.0.0" not in head, name
        for command in config["head_start_ray_commands"] + config["worker_start_ray_commands"]:
            if "ray start" in command:  # token auth on every node, with the token shipped to it
                assert "RAY_AUTH_MODE=token" in command, (name, command)
        assert "~/.ray/auth_token" in config["file_mounts"], name


def test_no_documented_path_turns_token_auth_off():
    for name in ("README.md", *CLUSTER_FILES):
        text = (ROOT / name).read_text()
        assert "RAY_AUTH_MODE=disabled" not in text, name
        assert "dashboard-host=0.0.0.0" not in text, name


def test_aws_security_group_opens_only_ssh_to_the_world():
    """The group the launcher creates holds Ray's defaults (all traffic within the group, SSH from anywhere:
    `ray up`, `ray exec` and `ray dashboard` reach the nodes over it, key-only) plus cluster.yaml's own
    rules. Those may open nothing else (6379, 8265, 10001, ...) to any address range; only the group's
    own nodes may be a source. Read from the YAML alone: Ray's AWS module needs boto3, which raysim
    does not install."""
    config = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    group = config["provider"]["security_group"]
    assert group["GroupName"]
    assert not any("SecurityGroupIds" in t["node_config"] for t in config["available_node_types"].values())
    for rule in group.get("IpPermissions", []):
        ranges = [r["CidrIp"] for r in rule.get("IpRanges", [])] + [r["CidrIpv6"] for r in rule.get("Ipv6Ranges", [])]
        if ranges:  # any address range at all, not just the whole internet: only SSH
            assert (rule["IpProtocol"], rule["FromPort"], rule["ToPort"]) == ("tcp", 22, 22), rule
        else:
            assert rule.get("UserIdGroupPairs"), f"rule with no source: {rule}"
