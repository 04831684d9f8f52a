"""The KubeRay RayJob of ``fusion-ray cluster k8s``, checked offline: every pod template (head,
workers, submitter) against the Kubernetes object schemas of the official ``kubernetes`` client
(its models refuse unknown fields and wrong types), the RayJob's own fields against the names of
KubeRay's ``ray.io/v1`` API, and what the sweep needs (token auth from a Secret, the tracking URI
from a Secret, GPUs, the shared storage). No cluster runs here: the manifest is untested live.
"""

from __future__ import annotations

import re
import shlex

import pytest
import yaml

from fusion_ray.launch.k8s import KubeJob, main, manifest, render_k8s

k8s = pytest.importorskip("kubernetes.client", reason="needs the kubernetes client (dev extra)")

#: Fields of KubeRay's ray.io/v1 RayJobSpec, RayClusterSpec, HeadGroupSpec and WorkerGroupSpec
#: that the renderer may use (KubeRay's API reference).
RAYJOB_SPEC = {
    "entrypoint", "submissionMode", "shutdownAfterJobFinishes", "ttlSecondsAfterFinished",
    "backoffLimit", "submitterPodTemplate", "rayClusterSpec", "activeDeadlineSeconds",
    "runtimeEnvYAML", "suspend", "entrypointNumCpus", "entrypointNumGpus", "jobId",
}  # fmt: skip
RAYCLUSTER_SPEC = {"rayVersion", "headGroupSpec", "workerGroupSpecs", "enableInTreeAutoscaling"}
HEAD_GROUP = {"rayStartParams", "template", "serviceType"}
WORKER_GROUP = {
    "groupName", "replicas", "minReplicas", "maxReplicas", "rayStartParams", "template",
}  # fmt: skip

pytestmark = pytest.mark.unit


def _templates(doc: dict) -> dict[str, dict]:
    spec = doc["spec"]
    cluster = spec["rayClusterSpec"]
    out = {"submitter": spec["submitterPodTemplate"], "head": cluster["headGroupSpec"]["template"]}
    for group in cluster["workerGroupSpecs"]:
        out[group["groupName"]] = group["template"]
    return out


def _check_kuberay_fields(doc: dict) -> None:
    assert doc["apiVersion"] == "ray.io/v1" and doc["kind"] == "RayJob"
    k8s.V1ObjectMeta.model_validate(doc["metadata"])
    spec = doc["spec"]
    assert set(spec) <= RAYJOB_SPEC, set(spec) - RAYJOB_SPEC
    cluster = spec["rayClusterSpec"]
    assert set(cluster) <= RAYCLUSTER_SPEC, set(cluster) - RAYCLUSTER_SPEC
    assert set(cluster["headGroupSpec"]) <= HEAD_GROUP
    for group in cluster["workerGroupSpecs"]:
        assert set(group) <= WORKER_GROUP, set(group) - WORKER_GROUP
        assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
    for params in [cluster["headGroupSpec"]["rayStartParams"]] + [
        g["rayStartParams"] for g in cluster["workerGroupSpecs"]
    ]:
        assert all(isinstance(v, str) for v in params.values()), "rayStartParams are strings"


def _validated(text: str) -> dict:
    doc = yaml.safe_load(text)
    _check_kuberay_fields(doc)
    for name, template in _templates(doc).items():
        try:
            k8s.V1PodTemplateSpec.model_validate(template)
        except Exception as exc:  # pydantic's ValidationError: say which template
            raise AssertionError(f"the {name} pod template: {exc}") from None
    return doc


def _env(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container["env"]}


def test_the_rayjob_validates_and_carries_what_the_sweep_needs():
    job = KubeJob(
        sweep_file="sweeps/full_grid.yaml",
        image="ghcr.io/lab/fusion-ray:1a2b3c",
        overrides=("train.epochs=3", "seeds=[0,1]"),
        namespace="lab",
        workers=3,
        gpus_per_worker=4,
    )
    doc = _validated(render_k8s(job))
    spec = doc["spec"]
    assert spec["entrypoint"] == (
        "python -m fusion_ray.sweep sweeps/full_grid.yaml train.epochs=3 'seeds=[0,1]'"
    )
    assert spec["shutdownAfterJobFinishes"] is True and spec["backoffLimit"] == 2
    assert doc["metadata"]["namespace"] == "lab"
    templates = _templates(doc)
    for name, template in templates.items():
        (container,) = template["spec"]["containers"]
        env = _env(container)
        assert env["RAY_AUTH_MODE"]["value"] == "token", name
        assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"] == {
            "name": "fusion-ray-ray-token", "key": "token",
        }, name  # fmt: skip
        if name == "submitter":
            continue
        uri = env["MLFLOW_TRACKING_URI"]["valueFrom"]["secretKeyRef"]
        assert uri == {"name": "fusion-ray-mlflow", "key": "uri"}
        assert env["MLFLOW_TRACKING_PASSWORD"]["valueFrom"]["secretKeyRef"]["optional"] is True
        assert env["FUSION_RAY_STORAGE"]["value"] == "/mnt/fusion-ray/ray_results"
        assert container["volumeMounts"] == [{"name": "shared", "mountPath": "/mnt/fusion-ray"}]
        claim = template["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"]
        assert claim == "fusion-ray-shared"
        assert not any("value" in e and "secret" in e["value"].lower() for e in env.values())
    worker = templates["gpu"]["spec"]["containers"][0]
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == "4"
    head = doc["spec"]["rayClusterSpec"]["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"
    assert yaml.safe_load(head["rayStartParams"]["resources"]) == '{"fusion_ray_driver": 64}'
    (group,) = doc["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert group["replicas"] == 3


def test_s3_storage_takes_credentials_from_a_secret_and_mounts_nothing():
    job = KubeJob(
        sweep_file="sweeps/quickstart.yaml",
        image="lab/fusion-ray:dev",
        storage="s3://bucket/fusion-ray/",
        s3_secret="aws-creds",
        gpus_per_worker=0,
        report=False,
    )
    doc = _validated(render_k8s(job))
    (group,) = doc["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert group["groupName"] == "cpu"
    (container,) = group["template"]["spec"]["containers"]
    assert _env(container)["FUSION_RAY_STORAGE"]["value"] == "s3://bucket/fusion-ray/ray_results"
    assert container["envFrom"] == [{"secretRef": {"name": "aws-creds"}}]
    assert "volumeMounts" not in container and "volumes" not in group["template"]["spec"]
    assert "nvidia.com/gpu" not in container["resources"]["limits"]
    assert doc["spec"]["entrypoint"].endswith("--no-report")


def test_the_schema_check_catches_a_misspelt_or_mistyped_field():
    """The check above can fail: a field the Kubernetes schema lacks, or a wrong type, is
    refused."""
    doc = manifest(KubeJob(sweep_file="s.yaml", image="img"))
    template = doc["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]
    template["spec"]["containers"][0]["volumeMount"] = []
    with pytest.raises(AssertionError, match="head pod template"):
        _validated(yaml.safe_dump(doc))
    doc = manifest(KubeJob(sweep_file="s.yaml", image="img"))
    doc["spec"]["submitterPodTemplate"]["spec"]["containers"][0]["env"] = "RAY_AUTH_MODE=token"
    with pytest.raises(AssertionError, match="submitter pod template"):
        _validated(yaml.safe_dump(doc))
    doc = manifest(KubeJob(sweep_file="s.yaml", image="img"))
    doc["spec"]["shutdownAfterJobFinish"] = True
    with pytest.raises(AssertionError):
        _validated(yaml.safe_dump(doc))


def test_the_header_command_renders_the_same_manifest(capsys):
    job = KubeJob(
        sweep_file="sweeps/quickstart.yaml",
        image="lab/fusion-ray:dev",
        overrides=("train.epochs=1",),
        workers=2,
        storage="pvc:lab-scratch",
        backoff_limit=5,
        report=False,
    )
    text = render_k8s(job)
    command = re.search(r"^#   (fusion-ray cluster k8s .*)$", text, re.M).group(1)
    assert main(shlex.split(command)[3:]) == 0
    assert capsys.readouterr().out == text


def test_every_problem_is_named_with_its_fix(capsys):
    code = main(["s.yaml", "--image", "a b", "--name", "Fusion_Ray", "--storage", "nfs:/x",
                 "--workers", "-1", "--memory-per-worker", "lots", "--workdir", "rel"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2
    for text in (
        "--image 'a b'",
        "--name 'Fusion_Ray': lower-case letters",
        "--storage 'nfs:/x': pvc:CLAIM or s3://BUCKET/PREFIX",
        "--workers -1: must be 0 or more",
        "--memory-per-worker 'lots': a Kubernetes quantity",
        "--workdir 'rel': an absolute path",
    ):
        assert text in err, text


def test_counts_a_32_bit_field_cannot_hold_are_refused_by_every_target(capsys):
    """Kubernetes' and SLURM's counts are 32-bit integers: a larger one is refused, named."""
    from fusion_ray.launch.slurm import main as slurm_main

    big = str(2**31)
    assert main(["s.yaml", "--image", "x", "--workers", big, "--ttl-seconds", "-1"]) == 2
    err = capsys.readouterr().err
    assert f"--workers {big}: must be at most 2,147,483,647 (a 32-bit count)" in err
    assert "--ttl-seconds -1: must be 0 or more" in err
    assert slurm_main(["s.yaml", "--nodes", big, "--join-timeout", str(2**40)]) == 2
    err = capsys.readouterr().err
    assert f"--nodes {big}: must be at most 2,147,483,647" in err and "--join-timeout" in err
    assert main(["s.yaml", "--image", "x", "--workers", str(2**31 - 1)]) == 0


def test_the_header_makes_the_token_through_a_pipe_not_the_command_line(capsys):
    """``$(openssl rand ...)`` inline would put the token in kubectl's arguments, which every
    user of the machine can read in the process list."""
    text = render_k8s(KubeJob(sweep_file="s.yaml", image="x"))
    line = next(line for line in text.splitlines() if "openssl" in line)
    assert "$(" not in line and "| kubectl create secret generic" in line
    assert "--from-file=token=/dev/stdin" in line
