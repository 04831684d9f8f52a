"""cluster.yaml and the lab file cluster-onprem.yaml, offline: both are what fusion_ray.launch.rayup
renders, Ray's own launcher validation accepts them, every trial of the study fits a node type,
fractional-GPU packing reaches Ray's resource request, the rendered shell commands do what they
say, and the commands of the cluster walkthrough in docs/ exist."""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fusion_ray.config import Resources, load_sweep, resources_for
from fusion_ray.config.grid import expand
from fusion_ray.driver.trial import trial_resources
from fusion_ray.launch import main as cluster_main
from fusion_ray.launch.rayup import EXAMPLE_LAB, Lab, render_aws, render_onprem
from tests.conftest import ROOT

CLUSTER = ROOT / "cluster.yaml"
LAB = ROOT / "cluster-onprem.yaml"
DRIVER = "fusion_ray_driver"


@pytest.fixture(scope="module")
def cluster() -> dict:
    return yaml.safe_load(CLUSTER.read_text())


@pytest.fixture(scope="module")
def lab() -> dict:
    return yaml.safe_load(LAB.read_text())


@pytest.mark.unit
def test_the_committed_files_are_the_rendered_ones():
    """Both files come from fusion_ray.launch.rayup's one node setup; edit that and render again."""
    assert CLUSTER.read_text() == render_aws(), (
        "cluster.yaml is stale: fusion-ray cluster aws > cluster.yaml"
    )
    assert LAB.read_text() == render_onprem(EXAMPLE_LAB), (
        f"cluster-onprem.yaml is stale: {shlex.join(EXAMPLE_LAB.argv())} > cluster-onprem.yaml"
    )
    header = LAB.read_text().split("cluster_name:")[0]
    assert shlex.join(EXAMPLE_LAB.argv()) in header, "the lab file names the command it came from"


@pytest.fixture
def study(monkeypatch):
    """The full grid as the head's profile sets it up (cluster.yaml head_setup_commands)."""
    monkeypatch.setenv("FUSION_RAY_STORAGE", "s3://example-bucket/fusion-ray/ray_results")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    return load_sweep(ROOT / "sweeps" / "full_grid.yaml")


@pytest.mark.unit
def test_rays_own_launcher_accepts_it(cluster):
    from ray.autoscaler._private.util import prepare_config, validate_config

    prepared = prepare_config(cluster)
    validate_config(prepared)
    assert prepared["provider"]["type"] == "aws"
    workers = {
        k: v for k, v in prepared["available_node_types"].items() if k != prepared["head_node_type"]
    }
    assert workers, "no worker node types"
    for name, node in prepared["available_node_types"].items():
        assert {"CPU", "GPU"} <= set(node["resources"]), f"{name}: resources must be explicit"
    for name, node in workers.items():
        assert node["min_workers"] == 0, f"{name}: idle GPUs must cost nothing"
        assert node["resources"]["GPU"] >= 1 and node["max_workers"] <= prepared["max_workers"]
    head = prepared["available_node_types"][prepared["head_node_type"]]["resources"]
    assert head["CPU"] == 0 and head["GPU"] == 0 and head[DRIVER] >= 1
    assert {n["resources"]["GPU"] for n in workers.values()} >= {1, 4}, (
        "single- and multi-GPU types"
    )


@pytest.mark.unit
def test_services_are_private_and_token_auth_is_on(cluster):
    text = CLUSTER.read_text()
    assert "0.0.0.0" not in text
    start = " ".join(cluster["head_start_ray_commands"])
    assert "mlflow server --host 127.0.0.1" in start and "--dashboard-host=127.0.0.1" in start
    assert "--backend-store-uri sqlite:///$HOME/mlflow/mlflow.db" in start
    assert '--artifacts-destination "$FUSION_RAY_S3/mlflow"' in start
    setup = " ".join(cluster["setup_commands"])
    assert "export RAY_AUTH_MODE=token" in setup
    assert cluster["file_mounts"]["~/.ray/auth_token"] == "~/.ray/auth_token"
    assert cluster["file_mounts"]["~/fusion-ray"] == "~/.fusion-ray/checkout"
    assert "-e ~/fusion-ray" in setup and '"ray[default,tune,train]==2.60.0"' in setup
    import ray

    assert ray.__version__ == "2.60.0", "cluster.yaml pins the Ray of this checkout; update both"


@pytest.mark.unit
def test_rays_own_launcher_accepts_the_lab_file(lab):
    from ray.autoscaler._private.util import prepare_config, validate_config

    prepared = prepare_config(lab)
    validate_config(prepared)
    assert prepared["provider"] == {
        "type": "local",
        "head_ip": "192.0.2.10",
        "worker_ips": ["192.0.2.11", "192.0.2.12"],
    }
    (node_type,) = prepared["available_node_types"].values()
    assert node_type["min_workers"] == node_type["max_workers"] == 2, "every worker joins"
    assert prepared["auth"] == {"ssh_user": "lab", "ssh_private_key": "~/.ssh/id_ed25519"}


def _start_flags(command: str) -> dict[str, str]:
    """The options of the `ray start` that ends a start command, as {option: value}."""
    argv = shlex.split(command.split(";")[-1])
    assert argv[:2] == ["ray", "start"], command
    return dict(arg.split("=", 1) if "=" in arg else (arg, "") for arg in argv[2:])


@pytest.mark.unit
def test_the_lab_head_offers_the_driver_resource_and_keeps_trials_off(lab, cluster):
    head = _start_flags(lab["head_start_ray_commands"][-1])
    assert json.loads(head["--resources"]) == {DRIVER: 64}
    assert head["--num-cpus"] == "0" and head["--num-gpus"] == "0"
    # the AWS head has the same from its node type; every other flag is the same in both files
    resources = ("--resources", "--num-cpus", "--num-gpus")
    aws = _start_flags(cluster["head_start_ray_commands"][-1])
    assert {k: v for k, v in head.items() if k not in resources} == aws
    assert aws["--dashboard-host"] == "127.0.0.1"
    assert _start_flags(lab["worker_start_ray_commands"][-1])["--address"] == "$RAY_HEAD_IP:6379"
    trials = yaml.safe_load(render_onprem(dataclasses.replace(EXAMPLE_LAB, head_trials=True)))
    flags = _start_flags(trials["head_start_ray_commands"][-1])
    assert "--num-cpus" not in flags and json.loads(flags["--resources"]) == {DRIVER: 64}


@pytest.mark.unit
def test_lab_services_are_private_and_token_auth_is_on(lab):
    assert "0.0.0.0" not in LAB.read_text()
    start = " ".join(lab["head_start_ray_commands"])
    assert "mlflow server --host 127.0.0.1" in start
    assert "--backend-store-uri sqlite:///$HOME/mlflow/mlflow.db" in start
    assert '--artifacts-destination "/mnt/shared/fusion-ray/mlflow"' in start
    setup = " ".join(lab["setup_commands"])
    assert "export RAY_AUTH_MODE=token" in setup
    assert 'FUSION_RAY_STORAGE="/mnt/shared/fusion-ray/ray_results"' in setup
    assert "MLFLOW_TRACKING_URI=http://127.0.0.1:5000" in setup
    assert lab["file_mounts"] == {
        "~/fusion-ray": "~/.fusion-ray/checkout",
        "~/.ray/auth_token": "~/.ray/auth_token",
    }


def _bash(command: str, home: Path) -> subprocess.CompletedProcess:
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin"}
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=env)


@pytest.mark.process
def test_the_aws_profile_exports_what_the_driver_reads(cluster, tmp_path):
    """The storage check and the profile, run for real in a scratch home."""
    check, *_, profile, bashrc = cluster["setup_commands"]
    (tmp_path / "fusion-ray.env").write_text("export FUSION_RAY_S3=/not/a/bucket\n")
    refused = _bash(check, tmp_path)
    assert refused.returncode == 1 and "must export FUSION_RAY_S3=s3://" in refused.stderr
    (tmp_path / "fusion-ray.env").write_text("export FUSION_RAY_S3=s3://bucket/prefix\n")
    assert _bash(check, tmp_path).returncode == 0
    assert _bash(f"{profile} && {bashrc} && {bashrc}", tmp_path).returncode == 0
    assert (tmp_path / ".bashrc").read_text() == ". ~/.fusion-ray-profile\n", "added once"
    shown = _bash(
        ". ~/.fusion-ray-profile && echo $PATH $FUSION_RAY_STORAGE $MLFLOW_TRACKING_URI "
        "$RAY_AUTH_MODE $RAY_ADDRESS",
        tmp_path,
    )
    assert shown.stdout.split() == [
        f"{tmp_path}/venv/bin:/usr/bin:/bin",
        "s3://bucket/prefix/ray_results",
        "http://127.0.0.1:5000",
        "token",
        "auto",
    ]


@pytest.mark.process
def test_the_lab_setup_refuses_missing_storage_and_another_ray(tmp_path):
    shared, other = tmp_path / "shared", tmp_path / "other"
    lab = Lab("h", (), "u", "/k", str(shared), python_env=sys.prefix, head_trials=True)
    check, environment, profile, _ = yaml.safe_load(render_onprem(lab))["setup_commands"]
    missing = _bash(check, tmp_path)
    assert missing.returncode == 1 and f"{shared} is not a writable folder" in missing.stderr
    shared.mkdir()
    assert _bash(check, tmp_path).returncode == 0
    assert _bash(environment, tmp_path).returncode == 0, "this interpreter has the pinned Ray"
    (other / "bin").mkdir(parents=True)
    (other / "bin" / "python").write_text("#!/bin/sh\necho 2.9.0\n")
    (other / "bin" / "python").chmod(0o755)
    lab = dataclasses.replace(lab, python_env=str(other))
    environment = yaml.safe_load(render_onprem(lab))["setup_commands"][1]
    refused = _bash(environment, tmp_path)
    assert refused.returncode == 1 and "must have Ray 2.60.0" in refused.stderr
    assert _bash(profile, tmp_path).returncode == 0
    shown = _bash(". ~/.fusion-ray-profile && echo $PYTHONPATH $FUSION_RAY_STORAGE", tmp_path)
    assert shown.stdout.split() == [f"{tmp_path}/fusion-ray", f"{shared}/ray_results"]


@pytest.mark.unit
def test_a_lab_file_with_problems_is_refused_with_all_of_them(capsys):
    code = cluster_main(
        ["onprem", "--head", "10.0.0.1", "--workers", "10.0.0.1", "--user", "lab"]
        + ["--key", "~/.ssh/id", "--storage", "shared/fusion-ray", "--mlflow-port", "6379"]
    )
    out, err = capsys.readouterr()
    assert code == 2 and out == "", "nothing is written when the file cannot work"
    assert "--workers 10.0.0.1: list each node once, not the head" in err
    assert "--storage 'shared/fusion-ray': an absolute path mounted on every node" in err
    assert "ports [6379, 8076, 8265, 6379]: distinct numbers" in err
    assert cluster_main(["onprem", "--head", "h", "--user", "u", "--key", "k", "--storage", "/s"])
    assert "no --workers: give some, or --head-trials" in capsys.readouterr().err
    assert cluster_main(["aws"]) == 0
    assert capsys.readouterr().out == CLUSTER.read_text()


@pytest.mark.process
@pytest.mark.parametrize("path", [CLUSTER, LAB], ids=lambda p: p.name)
def test_every_command_is_valid_bash(path):
    cluster = yaml.safe_load(path.read_text())
    for key in (
        "setup_commands",
        "head_setup_commands",
        "worker_setup_commands",
        "head_start_ray_commands",
        "worker_start_ray_commands",
        "initialization_commands",
    ):
        for command in cluster[key]:
            check = subprocess.run(["bash", "-n", "-c", command], capture_output=True, text=True)
            assert check.returncode == 0, f"{key}: {command}\n{check.stderr}"


@pytest.mark.unit
def test_the_head_profile_feeds_the_sweep_files(cluster, study):
    """FUSION_RAY_STORAGE and MLFLOW_TRACKING_URI, as exported on the head, reach the study's files.
    The login profile is the same on every node (nodes sharing a home directory agree)."""
    assert cluster["head_setup_commands"] == [] and cluster["worker_setup_commands"] == []
    head_profile = " ".join(cluster["setup_commands"])
    assert 'FUSION_RAY_STORAGE="$FUSION_RAY_S3/ray_results"' in head_profile
    assert "MLFLOW_TRACKING_URI=http://127.0.0.1:5000" in head_profile
    assert study.storage_path == "s3://example-bucket/fusion-ray/ray_results"
    assert study.tracking_uri == "http://127.0.0.1:5000"


def _fits(bundle: dict[str, float], node: dict[str, float]) -> bool:
    # Ray fills in each node's `memory` from its instance type; trials ask at most a token 1 KiB.
    return all(
        node.get(k, 0) >= v
        for k, v in bundle.items()
        if not (k == "memory" and "memory" not in node)
    )


def _requests(res: Resources) -> tuple[dict[str, float], list[dict[str, float]]]:
    """What a trial asks of Ray: its own Tune bundle, and its DDP workers' bundles (if any)."""
    trial = trial_resources(res)
    if res.workers == 1 and not res.force_trainer:
        return trial, []
    worker = {"CPU": res.cpus_per_worker, **({"GPU": res.gpus_per_worker} if res.use_gpu else {})}
    return trial, [worker] * res.workers


def _assert_fits(res: Resources, nodes: dict[str, dict], head: str, where: str) -> None:
    trial, workers = _requests(res)
    assert any(_fits(trial, n["resources"]) for n in nodes.values()), (
        f"{where}: trial bundle {trial} fits no node type"
    )
    if res.driver_resource:
        assert _fits(trial, nodes[head]["resources"]), (
            f"{where}: the driver resource must be on the head"
        )
    if workers:
        # a DDP gang fits on one node, so nccl stays on the node's own links
        total = {k: sum(w.get(k, 0) for w in workers) for k in workers[0]}
        assert any(_fits(total, n["resources"]) for k, n in nodes.items() if k != head), (
            f"{where}: {res.workers} workers fit no node type"
        )


@pytest.mark.unit
def test_every_trial_of_the_full_grid_fits_a_node_type(cluster, study):
    nodes, head = cluster["available_node_types"], cluster["head_node_type"]
    datasets = {c.dataset for c in expand(study)}
    assert datasets == {"ag_news", "imdb", "arxiv"}
    for dataset in sorted(datasets):
        res = resources_for(study, dataset)
        assert res.use_gpu, f"{dataset}: the study runs on GPUs"
        _assert_fits(res, nodes, head, dataset)
        trial, _ = _requests(res)
        assert not _fits(trial, nodes[head]["resources"]), (
            f"{dataset}: trials must not land on the head"
        )


@pytest.mark.unit
def test_the_ddp_recipe_in_cluster_yaml_fits_the_multi_gpu_type(cluster):
    """The long-document DDP resources that cluster.yaml's gpu_4x comment gives."""
    nodes, head = cluster["available_node_types"], cluster["head_node_type"]
    ddp = Resources(
        workers=4, use_gpu=True, gpus_per_worker=1, cpus_per_worker=8, driver_resource=DRIVER
    )
    _assert_fits(ddp, nodes, head, "ddp")
    assert trial_resources(ddp) == {"memory": 1024, DRIVER: 1}
    assert not _fits(_requests(ddp)[1][0], nodes[head]["resources"]), (
        "DDP workers must not land on the head"
    )


@pytest.mark.unit
def test_fractional_gpus_pack_trials_and_reach_rays_request(cluster, study):
    from ray.tune import PlacementGroupFactory

    res = resources_for(study, "ag_news")  # the short-document preset: 2 per GPU (graphed steps)
    assert (res.use_gpu, res.gpus_per_worker, res.workers) == (True, 0.5, 1)
    request = trial_resources(res)
    assert request == {"CPU": 2, "GPU": 0.5}
    factory = PlacementGroupFactory([request])  # what fusion_ray.sweep hands to tune.with_resources
    assert factory.required_resources == {"CPU": 2, "GPU": 0.5}
    assert factory.bundles == [{"CPU": 2, "GPU": 0.5}]
    node = cluster["available_node_types"]["gpu_1x"]["resources"]
    # a gpu_1x node's GPU holds two of them (its 8 CPUs would allow four)
    assert node["GPU"] / request["GPU"] == 2 and node["CPU"] / request["CPU"] == 4
    imdb = trial_resources(resources_for(study, "imdb"))  # medium documents: also 2 per GPU
    assert imdb == {"CPU": 2, "GPU": 0.5}
    assert min(node["GPU"] / imdb["GPU"], node["CPU"] / imdb["CPU"]) == 2, "two per gpu_1x node"
    # the same settings in a tiny sweep file are accepted and give the same request
    for fraction in (0.5, 0.25, 0.125):
        packed = Resources(use_gpu=True, gpus_per_worker=fraction, cpus_per_worker=1)
        assert trial_resources(packed) == {"CPU": 1, "GPU": fraction}


@pytest.mark.unit
def test_driver_resource_must_be_a_custom_resource():
    assert Resources(workers=2, driver_resource=DRIVER).driver_resource == DRIVER
    for bad in ("GPU", "CPU", "memory", "my resource", ""):
        with pytest.raises(ValueError, match="custom resource"):
            Resources(workers=2, driver_resource=bad)
    # one-worker trials train in their Tune trial: the driver resource does not apply
    assert trial_resources(Resources(driver_resource=DRIVER)) == {"CPU": 1.0}


def _cluster_walkthrough() -> str:
    """The cluster walkthrough and the tuning page of the documentation (once the README's
    cluster section)."""
    pages = [ROOT / "docs" / "how-to" / "cluster.md", ROOT / "docs" / "how-to" / "hpo.md"]
    return "\n".join(page.read_text() for page in pages)


def _split(line: str) -> list[list[str]]:
    """One shell line as commands (split at && and ; outside quotes), each an argv; a quoted
    command given to `ray exec` is split again, so the `python -m ...` inside it is checked too."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|<>")
    lexer.whitespace_split = True
    commands, argv = [], []
    for token in [*lexer, ";"]:
        if set(token) <= set(";&|<>"):
            if argv:
                commands.append(argv)
                commands += [c for arg in argv[1:] if " " in arg for c in _split(arg)]
            argv = []
        else:
            argv.append(token)
    return commands


def _shell_commands(section: str) -> list[list[str]]:
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", section, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            if line and not line.startswith("#"):
                commands += _split(line)
    return commands


@pytest.mark.unit
def test_every_command_of_the_readme_walkthrough_exists(capsys):
    """`ray ...` and `python -m fusion_ray....` lines: the subcommand and every option exist."""
    import click
    from ray.scripts.scripts import cli

    from fusion_ray.hpo.cli import main as hpo_main
    from fusion_ray.sweep import main as sweep_main

    commands = _shell_commands(_cluster_walkthrough())
    ray_commands = [c for c in commands if c[0] == "ray"]
    used = {c[1] for c in ray_commands}
    assert {
        "up",
        "exec",
        "attach",
        "dashboard",
        "rsync-down",
        "down",
        "get-auth-token",
        "status",
    } <= used
    for argv in ray_commands:
        command, args = cli, argv[1:]
        while isinstance(command, click.Group):
            assert args[0] in command.commands, (
                f"`{' '.join(argv)}`: no such ray command {args[0]!r}"
            )
            command, args = command.commands[args[0]], args[1:]
        options = {
            o
            for p in command.params
            for o in [*getattr(p, "opts", []), *getattr(p, "secondary_opts", [])]
        }
        for arg in args:
            if arg.startswith("-"):
                assert arg.split("=")[0] in options, (
                    f"`{' '.join(argv)}`: ray {argv[1]} has no option {arg}"
                )

    mains = {"fusion_ray.sweep": sweep_main, "fusion_ray.hpo": hpo_main}
    checked = set()
    for argv in commands:
        if argv[:2] != ["python", "-m"] or argv[2] not in mains:
            continue
        with pytest.raises(SystemExit):
            mains[argv[2]](["--help"])
        usage = capsys.readouterr().out
        for arg in argv[3:]:
            if arg.startswith("-"):
                assert re.search(rf"(^|\s){re.escape(arg)}\b", usage), (
                    f"`{' '.join(argv)}`: no option {arg}"
                )
            elif arg.endswith(".yaml") and not arg.startswith("/"):
                assert (ROOT / arg).is_file(), f"`{' '.join(argv)}`: {arg} does not exist"
        checked.add(argv[2])
    assert checked == set(mains)
