"""A KubeRay ``RayJob`` that runs a sweep on Kubernetes:
``fusion-ray cluster k8s SWEEP.yaml [KEY=VALUE ...] --image IMAGE ... > rayjob.yaml`` then
``kubectl apply -f rayjob.yaml``.

KubeRay makes a Ray cluster for the job (a head that runs the sweep driver, with no CPU for
trials and the ``fusion_ray_driver`` resource, and a group of GPU workers), submits the sweep to
it, and deletes the cluster when the sweep ends. Ray's token authentication is on with the token
from a Secret (every container, and the submitter, get ``RAY_AUTH_MODE=token`` and
``RAY_AUTH_TOKEN``); the MLflow tracking URI (and optional basic-auth user and password) come
from another Secret; checkpoints go to a shared ReadWriteMany volume or to S3, through
``FUSION_RAY_STORAGE``, which the sweep files read. A failed or evicted run is retried
``backoff_limit`` times, each resuming from the checkpoints and the tracking store.

The manifest is built as Python objects and written with ``yaml.safe_dump``: every value is a
YAML string of its own, the entrypoint's words are quoted with ``shlex``, and the comments above
it hold printable text only. The manifests are checked offline against the Kubernetes object
schemas (tests/fusion_ray/launch/test_k8s.py) and have not been run on a live cluster.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from fusion_ray.launch.shell import shell_join, shell_word, sweep_command_problems, text_problem
from fusion_ray.launch.target import (
    DRIVER_RESOURCE,
    DRIVER_SLOTS,
    RAY_VERSION,
    LaunchTarget,
    count_problems,
    run,
)

_S3 = re.compile(r"s3://[^/\s]+(/\S*)?")
_DNS = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_QUANTITY = re.compile(r"\d+(\.\d+)?(m|k|M|G|T|Ki|Mi|Gi|Ti)?", re.ASCII)
#: An extended resource's name, as device plugins register it: DOMAIN/NAME (nvidia.com/gpu).
_RESOURCE = re.compile(
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
    r"/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
)
MOUNT = "/mnt/fusion-ray"


@dataclass(frozen=True)
class KubeJob:
    """What ``fusion-ray cluster k8s`` takes."""

    sweep_file: str
    """The sweep file, relative to ``workdir`` in the image."""
    image: str
    """An image with Ray (the same version as the driver's) and this project installed."""
    overrides: tuple[str, ...] = ()
    name: str = "fusion-ray-sweep"
    namespace: str | None = None
    workdir: str = "/home/ray/fusion-ray"
    """The checkout inside the image: the entrypoint runs there."""
    workers: int = 1
    gpus_per_worker: int = 1
    cpus_per_worker: int = 8
    memory_per_worker: str = "32Gi"
    head_cpus: int = 4
    head_memory: str = "16Gi"
    gpu_resource: str = "nvidia.com/gpu"
    token_secret: str = "fusion-ray-ray-token"
    """A Secret with key ``token``: Ray's authentication token."""
    tracking_secret: str = "fusion-ray-mlflow"
    """A Secret with key ``uri`` (the MLflow server), optionally ``username`` and ``password``."""
    storage: str = "pvc:fusion-ray-shared"
    """``pvc:CLAIM`` (a ReadWriteMany claim, mounted at /mnt/fusion-ray on every pod) or
    ``s3://BUCKET/PREFIX`` (credentials from ``s3_secret`` or the pods' service account)."""
    s3_secret: str | None = None
    """A Secret whose keys become environment variables (AWS_ACCESS_KEY_ID, ...)."""
    backoff_limit: int = 2
    """Times a failed run of the whole job is retried (each resumes the sweep)."""
    ttl_seconds: int = 3600
    """Seconds the finished job's record stays (the cluster itself is deleted at once)."""
    report: bool = True

    def problems(self) -> list[str]:
        """Every reason the manifest could not work, each with its fix; empty when it can."""
        out = self._text_problems()
        if out:
            return out
        out = sweep_command_problems(self.sweep_file, self.overrides)
        names: list[tuple[str, str | None]] = [
            ("--name", self.name),
            ("--token-secret", self.token_secret),
        ]
        names += [("--tracking-secret", self.tracking_secret), ("--namespace", self.namespace)]
        names += [("--s3-secret", self.s3_secret)]
        if self.storage.startswith("pvc:"):
            names.append(("--storage pvc:", self.storage[4:]))
        elif not (self.storage.isprintable() and _S3.fullmatch(self.storage)):
            out.append(f"--storage {self.storage!r}: pvc:CLAIM or s3://BUCKET/PREFIX")
        for what, value in names:
            if value is not None and not (_DNS.fullmatch(value) and len(value) <= 63):
                out.append(f"{what} {value!r}: lower-case letters, digits and '-' (a DNS label)")
        return out + self._size_problems()

    def _size_problems(self) -> list[str]:
        out = count_problems(
            [
                ("--workers", self.workers, 0),
                ("--gpus-per-worker", self.gpus_per_worker, 0),
                ("--cpus-per-worker", self.cpus_per_worker, 1),
                ("--head-cpus", self.head_cpus, 1),
                ("--backoff-limit", self.backoff_limit, 0),
                ("--ttl-seconds", self.ttl_seconds, 0),
            ]
        )
        for what, value in [("--memory-per-worker", self.memory_per_worker),
                            ("--head-memory", self.head_memory)]:  # fmt: skip
            if not _QUANTITY.fullmatch(value):
                out.append(f"{what} {value!r}: a Kubernetes quantity, e.g. 32Gi")
        if not self.image.isprintable() or not self.image or " " in self.image:
            out.append(f"--image {self.image!r}: an image reference without spaces")
        if not _RESOURCE.fullmatch(self.gpu_resource):
            out.append(
                f"--gpu-resource {self.gpu_resource!r}: a device plugin's resource name, "
                "DOMAIN/NAME (e.g. nvidia.com/gpu, amd.com/gpu)"
            )
        if not self.workdir.startswith("/"):
            out.append(f"--workdir {self.workdir!r}: an absolute path inside the image")
        return out

    def _text_problems(self) -> list[str]:
        """Text no manifest can carry: a NUL, or what is not UTF-8 (Kubernetes takes JSON)."""
        texts = [("the sweep file", self.sweep_file)]
        texts += [(f"override {i + 1}", override) for i, override in enumerate(self.overrides)]
        texts += [(flag, getattr(self, name)) for name, (flag, _) in _FLAGS.items()]
        out = []
        for what, value in texts:
            if not isinstance(value, str):
                continue
            problem = text_problem(what, value)
            if problem is None and any("\ud800" <= c <= "\udfff" for c in value):
                problem = f"{what} {ascii(value)[:80]}: not UTF-8 (Kubernetes takes UTF-8 only)"
            if problem:
                out.append(problem)
        return out


def _secret_env(name: str, secret: str, key: str, optional: bool = False) -> dict[str, Any]:
    ref: dict[str, Any] = {"name": secret, "key": key}
    if optional:
        ref["optional"] = True
    return {"name": name, "valueFrom": {"secretKeyRef": ref}}


def _env(job: KubeJob) -> list[dict[str, Any]]:
    """Every Ray container's environment: token auth, the tracking store, the storage root."""
    storage = job.storage if job.storage.startswith("s3://") else MOUNT
    return [
        {"name": "RAY_AUTH_MODE", "value": "token"},
        _secret_env("RAY_AUTH_TOKEN", job.token_secret, "token"),
        _secret_env("MLFLOW_TRACKING_URI", job.tracking_secret, "uri"),
        _secret_env("MLFLOW_TRACKING_USERNAME", job.tracking_secret, "username", optional=True),
        _secret_env("MLFLOW_TRACKING_PASSWORD", job.tracking_secret, "password", optional=True),
        {"name": "FUSION_RAY_STORAGE", "value": f"{storage.rstrip('/')}/ray_results"},
    ]


def _container(job: KubeJob, name: str, cpus: int, memory: str, gpus: int) -> dict[str, Any]:
    limits = {"cpu": str(cpus), "memory": memory}
    if gpus:
        limits[job.gpu_resource] = str(gpus)
    container: dict[str, Any] = {
        "name": name,
        "image": job.image,
        "workingDir": job.workdir,
        "env": _env(job),
        "resources": {"requests": {"cpu": str(cpus), "memory": memory}, "limits": limits},
    }
    if job.s3_secret:
        container["envFrom"] = [{"secretRef": {"name": job.s3_secret}}]
    if job.storage.startswith("pvc:"):
        container["volumeMounts"] = [{"name": "shared", "mountPath": MOUNT}]
    return container


def _pod(job: KubeJob, container: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [container]}
    if job.storage.startswith("pvc:"):
        spec["volumes"] = [
            {"name": "shared", "persistentVolumeClaim": {"claimName": job.storage[4:]}}
        ]
    return {"metadata": {"labels": {"app.kubernetes.io/name": "fusion-ray"}}, "spec": spec}


def manifest(job: KubeJob) -> dict[str, Any]:
    """The RayJob as a mapping. Raises ValueError listing every problem of ``job``."""
    problems = job.problems()
    if problems:
        raise ValueError("cannot render the RayJob:\n  " + "\n  ".join(problems))
    entrypoint = shlex.join(["python", "-m", "fusion_ray.sweep", job.sweep_file, *job.overrides])
    if not job.report:
        entrypoint += " --no-report"
    head = _container(job, "ray-head", job.head_cpus, job.head_memory, 0)
    worker = _container(
        job, "ray-worker", job.cpus_per_worker, job.memory_per_worker, job.gpus_per_worker
    )
    submitter = {
        "name": "ray-job-submitter",
        "image": job.image,
        "env": [{"name": "RAY_AUTH_MODE", "value": "token"},
                _secret_env("RAY_AUTH_TOKEN", job.token_secret, "token")],
        "resources": {"requests": {"cpu": "500m", "memory": "512Mi"},
                      "limits": {"cpu": "1", "memory": "1Gi"}},
    }  # fmt: skip
    metadata: dict[str, Any] = {
        "name": job.name,
        "labels": {"app.kubernetes.io/name": "fusion-ray"},
    }
    if job.namespace:
        metadata["namespace"] = job.namespace
    driver = json.dumps({DRIVER_RESOURCE: DRIVER_SLOTS})
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": metadata,
        "spec": {
            "entrypoint": entrypoint,
            "submissionMode": "K8sJobMode",
            "shutdownAfterJobFinishes": True,
            "ttlSecondsAfterFinished": job.ttl_seconds,
            "backoffLimit": job.backoff_limit,
            "submitterPodTemplate": {"spec": {"restartPolicy": "Never", "containers": [submitter]}},
            "rayClusterSpec": {
                "rayVersion": RAY_VERSION,
                "headGroupSpec": {
                    # no trials on the head: the driver and DDP trials' controllers only
                    "rayStartParams": {
                        "num-cpus": "0",
                        "num-gpus": "0",
                        "resources": json.dumps(driver),
                    },  # fmt: skip
                    "template": _pod(job, head),
                },
                "workerGroupSpecs": [
                    {
                        "groupName": "gpu" if job.gpus_per_worker else "cpu",
                        "replicas": job.workers,
                        "minReplicas": job.workers,
                        "maxReplicas": job.workers,
                        "rayStartParams": {},
                        "template": _pod(job, worker),
                    }
                ],
            },
        },
    }


def render_k8s(job: KubeJob) -> str:
    """The RayJob as YAML, with a header saying how it was rendered and what it needs."""
    body = yaml.safe_dump(manifest(job), sort_keys=False, width=10**6)
    storage = (
        f"the ReadWriteMany claim {job.storage[4:]} (mounted at {MOUNT})"
        if job.storage.startswith("pvc:")
        else f"{shell_word(job.storage)} (credentials from "
        + (f"Secret {job.s3_secret})" if job.s3_secret else "the pods' service account)")
    )
    # comments in printable characters only, every value quoted as a shell word: no line break
    # (YAML also ends a comment at U+0085, U+2028 and U+2029) reaches the file from a value
    header = [
        "# fusion-ray: a sweep as a KubeRay RayJob (untested on a live cluster; the manifest is",
        "# checked against the Kubernetes schemas offline). Rendered by",
        f"#   {shell_join(['fusion-ray', 'cluster', 'k8s', *_argv(job)])}",
        "# Needs: the KubeRay operator; the image (Ray "
        f"{RAY_VERSION} and this project at {shell_word(job.workdir)});",
        f"# Secret {job.token_secret} (key token), Secret {job.tracking_secret} (key uri; "
        "username, password optional);",
        f"# checkpoints on {storage}.",
        "#   openssl rand -hex 32 | tr -d '\\n' | kubectl create secret generic "
        + job.token_secret + " --from-file=token=/dev/stdin",
        "#   kubectl create secret generic " + job.tracking_secret
        + " --from-literal=uri=http://mlflow.lab.svc:5000",
    ]  # fmt: skip
    return "\n".join(header) + "\n" + body


#: field -> (flag, help), in the order of ``--help`` and of the header's command.
_FLAGS = {
    "image": ("--image", "an image with Ray and this project installed (required)"),
    "name": ("--name", "the RayJob's name (a DNS label)"),
    "namespace": ("--namespace", "the namespace (default: kubectl's current one)"),
    "workdir": ("--workdir", "the checkout inside the image, where the sweep runs"),
    "workers": ("--workers", "Ray worker pods"),
    "gpus_per_worker": ("--gpus-per-worker", "GPUs of each worker pod"),
    "cpus_per_worker": ("--cpus-per-worker", "CPUs of each worker pod"),
    "memory_per_worker": ("--memory-per-worker", "memory of each worker pod (e.g. 32Gi)"),
    "head_cpus": ("--head-cpus", "CPUs of the head pod (the driver; no trials)"),
    "head_memory": ("--head-memory", "memory of the head pod (e.g. 16Gi)"),
    "gpu_resource": ("--gpu-resource", "the GPUs' resource name (e.g. nvidia.com/gpu)"),
    "token_secret": ("--token-secret", "the Secret with Ray's token (key token)"),
    "tracking_secret": ("--tracking-secret", "the Secret with the MLflow server (key uri)"),
    "storage": ("--storage", "checkpoints: pvc:CLAIM (ReadWriteMany) or s3://BUCKET/PREFIX"),
    "s3_secret": ("--s3-secret", "a Secret whose keys become the pods' S3 credentials"),
    "backoff_limit": ("--backoff-limit", "times a failed run of the whole job is retried"),
    "ttl_seconds": ("--ttl-seconds", "seconds the finished job's record stays"),
    "report": ("--report", "write the analysis report at the end"),
}


def _argv(job: KubeJob) -> list[str]:
    args = [job.sweep_file, *job.overrides]
    defaults = KubeJob(sweep_file="", image="")
    for name, (flag, _) in _FLAGS.items():
        value = getattr(job, name)
        if name != "image" and value == getattr(defaults, name):
            continue
        if isinstance(value, bool):
            args.append(flag if value else f"--no-{flag[2:]}")
        else:
            args.append(f"{flag}={value}")  # one word: a value may start with '-'
    return args


class KubeTarget(LaunchTarget):
    """A KubeRay RayJob: KubeRay makes a Ray cluster for the sweep and deletes it after
    (kubectl apply -f it)."""

    summary = "print a KubeRay RayJob that runs a sweep (kubectl apply -f it)"
    shell_keys = ("entrypoint",)  # KubeRay runs the RayJob's entrypoint through a shell
    output = "yaml"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        defaults = KubeJob(sweep_file="", image="")
        for name, (flag, text) in _FLAGS.items():
            default = getattr(defaults, name)
            if isinstance(default, bool):
                action = argparse.BooleanOptionalAction
                parser.add_argument(flag, dest=name, action=action, default=default, help=text)
            elif name == "image":
                parser.add_argument(flag, dest=name, required=True, help=text)
            else:
                kind = int if isinstance(default, int) else str
                parser.add_argument(flag, dest=name, type=kind, default=default, help=text)

    def render(self, args: argparse.Namespace) -> str:
        values = {name: getattr(args, name) for name in _FLAGS}
        job = KubeJob(sweep_file=args.sweep_file, overrides=tuple(args.overrides), **values)
        return render_k8s(job)

    def example_args(self) -> list[str]:
        return ["--image", "registry.example.com/fusion-ray:latest"]


def main(argv: Sequence[str] | None = None) -> int:
    """``fusion-ray cluster k8s ARGV...``."""
    return run("k8s", list(sys.argv[1:] if argv is None else argv))
