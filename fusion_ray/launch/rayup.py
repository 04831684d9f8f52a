"""The ``ray up`` launch targets: Ray cluster launcher files, for AWS (``aws``) and for a lab's own
machines (``onprem``), from one definition of how a node is made ready to run a sweep:
``fusion-ray cluster {aws,onprem}`` (or ``python -m fusion_ray.launch {aws,onprem}``).

Both files set every node up the same way: a Python environment with the laptop's Ray and the
project at the commit being run (the checkout the laptop syncs), a login profile that puts that
environment first, turns on Ray's token authentication and tells the sweep driver where
checkpoints (a shared path or S3) and MLflow (a server on the head's 127.0.0.1) are; the head
starts that MLflow server, then Ray with the dashboard on 127.0.0.1 and the ``fusion_ray_driver``
resource. Only the provider, the node types and where the storage root comes from differ, so a
change to the setup is made here once and both files are rendered again:

    fusion-ray cluster aws > cluster.yaml            # committed; a test compares them
    fusion-ray cluster onprem --head 10.0.0.1 --workers 10.0.0.2,10.0.0.3 \\
        --user lab --key ~/.ssh/id_ed25519 --storage /mnt/shared/fusion-ray > cluster-lab.yaml

A lab's file is rendered rather than written with placeholders because Ray's cluster YAML
expands no environment variables, and its ``local`` provider takes no node types: the addresses,
and the head's resources as ``ray start`` flags, have to be in the file itself.

Every value from the command line reaches the file through ``yaml.safe_dump`` and, inside a
shell command, as a quoted shell word; the comments hold printable text only, so no value (a
carriage return or U+2028 in ``--ssh-proxy-command`` included) ends a comment or adds a key.
Text that no file can carry (a control character where a command must stay one line, a NUL) is
refused, naming its flag, before anything is written.

Why one module of this size: both launcher files are rendered from one ``NodeSetup`` whose
setup and start commands they share; apart, a change to how a node is made ready could reach
one file and not the other.
"""

from __future__ import annotations

import argparse
import re
import shlex
import textwrap
from dataclasses import dataclass, field

import yaml

from fusion_ray.launch.shell import in_double_quotes, shell_join, shell_word
from fusion_ray.launch.target import (
    DRIVER_RESOURCE,
    DRIVER_SLOTS,
    PYTHON_VERSION,
    RAY_VERSION,
    LaunchTarget,
)

#: On the laptop: a clean clone of the commit being run, synced to ``~/fusion-ray`` on every node.
CHECKOUT = "~/.fusion-ray/checkout"


@dataclass(frozen=True)
class Ports:
    """The head's ports (the object manager's on every node). Only SSH is reached from outside:
    MLflow and the dashboard listen on 127.0.0.1, Ray's own ports within the cluster's network."""

    ray: int = 6379
    object_manager: int = 8076
    dashboard: int = 8265
    mlflow: int = 5000


@dataclass(frozen=True)
class NodeSetup:
    """What every node gets, whichever provider starts it: the one source of both cluster files'
    file mounts, setup commands and start commands."""

    storage: str
    """The shared root as bash reads it inside double quotes: checkpoints go to
    ``<storage>/ray_results`` (the sweep files' ``storage_path`` through ``FUSION_RAY_STORAGE``),
    MLflow artifacts to ``<storage>/mlflow``. ``$FUSION_RAY_S3`` (from the env file), or a path or
    URI through ``in_double_quotes``."""
    storage_check: str | None = None
    """Run first on every node; fails, saying how to fix it, when the storage cannot be used."""
    env_file: bool = False
    """Mount the laptop's ``~/.fusion-ray/cluster.env`` as ``~/fusion-ray.env`` and source it."""
    python_env: str | None = None
    """An existing environment at the same path on every node (Ray and the project's dependencies
    installed); the synced checkout goes first on its PYTHONPATH. None: build ``~/venv`` with uv."""
    s3: bool = False
    """Install boto3 (the MLflow server's S3 artifact store)."""
    ports: Ports = field(default_factory=Ports)
    head_resources: str = ""
    """Extra ``ray start --head`` flags: the head's resources, where the provider has no node
    types to declare them."""

    @property
    def mlflow_uri(self) -> str:
        return f"http://127.0.0.1:{self.ports.mlflow}"


# ----------------------------------------------------------------------------- the shared steps


def file_mounts(setup: NodeSetup) -> dict[str, str]:
    """Laptop -> every node: the checkout, the env file (if any) and Ray's token."""
    mounts = {"~/fusion-ray": CHECKOUT}
    if setup.env_file:
        mounts["~/fusion-ray.env"] = "~/.fusion-ray/cluster.env"
    mounts["~/.ray/auth_token"] = "~/.ray/auth_token"
    return mounts


def _environment_commands(setup: NodeSetup) -> list[str]:
    if setup.python_env is None:
        packages = f'"ray[default,tune,train]=={RAY_VERSION}"' + (" boto3" if setup.s3 else "")
        return [
            "test -x ~/.local/bin/uv || (curl -LsSf https://astral.sh/uv/install.sh | sh)",
            f"test -x ~/venv/bin/python || ~/.local/bin/uv venv --python {PYTHON_VERSION} ~/venv",
            f"~/.local/bin/uv pip install --python ~/venv/bin/python {packages} -e ~/fusion-ray",
        ]
    word, text = shell_word(setup.python_env), in_double_quotes(setup.python_env)
    return [
        f"test \"$({word}/bin/python -c 'import ray; print(ray.__version__)')\" = {RAY_VERSION} || "
        f"{{ echo \"{text}/bin/python on $(hostname) must have Ray {RAY_VERSION} (the laptop's) "
        f"and this project's dependencies, e.g. {text}/bin/pip install "
        f"'ray[default,tune,train]=={RAY_VERSION}' -e CHECKOUT\" >&2; exit 1; }}"
    ]


def profile_lines(setup: NodeSetup) -> list[str]:
    """``~/.fusion-ray-profile``, sourced by every shell Ray opens on a node. The same on every
    node, so nodes that share a home directory (NFS) agree; only the head runs a driver."""
    env = "$HOME/venv" if setup.python_env is None else in_double_quotes(setup.python_env)
    lines = [f'export PATH="{env}/bin:$PATH"']
    if setup.python_env is not None:
        lines.append('export PYTHONPATH="$HOME/fusion-ray"')  # the synced commit runs
    if setup.env_file:
        lines.append(". ~/fusion-ray.env")
    return [
        *lines,
        "export RAY_AUTH_MODE=token",
        f'export FUSION_RAY_STORAGE="{setup.storage}/ray_results" '
        f"MLFLOW_TRACKING_URI={setup.mlflow_uri} RAY_ADDRESS=auto",
    ]


def setup_commands(setup: NodeSetup) -> list[str]:
    """Every node: the storage check, the Python environment, the login profile."""
    profile = " ".join(shlex.quote(line) for line in profile_lines(setup))
    return [
        *([setup.storage_check] if setup.storage_check else []),
        *_environment_commands(setup),
        f"printf '%s\\n' {profile} > ~/.fusion-ray-profile",
        "grep -qs fusion-ray-profile ~/.bashrc || echo '. ~/.fusion-ray-profile' >> ~/.bashrc",
    ]


def head_start_commands(setup: NodeSetup) -> list[str]:
    """The head: MLflow (unless already up; `ray up` waits until it answers), then Ray."""
    ports, health = setup.ports, f"{setup.mlflow_uri}/health"
    server = (
        f"mlflow server --host 127.0.0.1 --port {ports.mlflow} "
        "--backend-store-uri sqlite:///$HOME/mlflow/mlflow.db "
        f'--artifacts-destination "{setup.storage}/mlflow"'
    )
    head_flags = f" {setup.head_resources}" if setup.head_resources else ""
    return [
        "ray stop",
        f"mkdir -p ~/mlflow && (curl -sf {health} > /dev/null || (cd ~/mlflow && "
        f"{{ nohup {server} < /dev/null > ~/mlflow/server.log 2>&1 & }} && "
        "echo $! > ~/mlflow/server.pid))",
        f"for i in $(seq 60); do curl -sf {health} > /dev/null && exit 0; sleep 1; done; "
        f'echo "no MLflow server answers at {setup.mlflow_uri} after 60 s, see ~/mlflow/server.log '
        'on the head" >&2; exit 1',
        f"ulimit -n 65536; ray start --head --port={ports.ray} "
        f"--object-manager-port={ports.object_manager} "
        "--autoscaling-config=~/ray_bootstrap_config.yaml --dashboard-host=127.0.0.1 "
        f"--dashboard-port={ports.dashboard}{head_flags} --disable-usage-stats",
    ]


def worker_start_commands(setup: NodeSetup) -> list[str]:
    """A worker: Ray, joining the head (the launcher sets RAY_HEAD_IP)."""
    return [
        "ray stop",
        f"ulimit -n 65536; ray start --address=$RAY_HEAD_IP:{setup.ports.ray} "
        f"--object-manager-port={setup.ports.object_manager} --disable-usage-stats",
    ]


# ----------------------------------------------------------------------------- YAML text


class _Dumper(yaml.SafeDumper):
    """``yaml.safe_dump``'s dumper, writing the styles of ``_Flow`` and ``_Quoted``."""

    indent_lists = False

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        return super().increase_indent(flow, indentless and not self.indent_lists)


class _IndentedDumper(_Dumper):
    """Lists under a key indented (``key:`` then ``  - item``), as the command lists are."""

    indent_lists = True


class _Flow(list):
    """A list written on one line, ``[a, b]``."""


class _Quoted(str):
    """A string written between double quotes."""


_Dumper.add_representer(
    _Flow, lambda dumper, v: dumper.represent_sequence("tag:yaml.org,2002:seq", v, flow_style=True)
)
_Dumper.add_representer(
    _Quoted, lambda dumper, v: dumper.represent_scalar("tag:yaml.org,2002:str", v, style='"')
)


def _dump(value: dict, indent_lists: bool = False) -> str:
    """``value`` serialised by a safe dumper: every string is a YAML scalar of its own, escaped
    where it holds a line break or any other character YAML must not see as itself."""
    dumper = _IndentedDumper if indent_lists else _Dumper
    return yaml.dump(value, Dumper=dumper, width=10**6, sort_keys=False, default_flow_style=False)


def _printable(text: str) -> str:
    """``text`` with every character that is not printable written as its escape (``\\r``,
    ``\\x85``, ``\\u2028``): a comment holding it ends at no line break YAML knows."""
    return "".join(char if char.isprintable() else ascii(char)[1:-1] for char in text)


def _comment(text: str) -> str:
    """``text`` as YAML comment lines of at most 100 characters, printable characters only."""
    lines = textwrap.wrap(_printable(text), 98, break_on_hyphens=False)
    return "".join(f"# {line}\n" for line in lines)


def _comment_lines(*lines: str) -> str:
    """Comment lines as given (``#`` included), printable characters only."""
    return "".join(_printable(line) + "\n" for line in lines)


def _block(comment: str | None, keys: dict, indent_lists: bool = False) -> str:
    """Top-level keys, serialised, after a comment saying what they do."""
    return (_comment(comment) if comment else "") + _dump(keys, indent_lists)


def _shared_sections(setup: NodeSetup) -> str:
    """file_mounts .. worker_start_ray_commands, with their comments: the same in both files but
    for the setup's parameters."""
    env = (
        f"Python {PYTHON_VERSION} in ~/venv (uv), the same Ray as the laptop's, this checkout "
        "(editable, so a re-synced checkout is what runs)"
        if setup.python_env is None
        else f"the existing environment {setup.python_env} (checked for Ray {RAY_VERSION}), with "
        "this checkout first on its PYTHONPATH (so a re-synced checkout is what runs)"
    )
    env_file = ", cluster.env holds FUSION_RAY_S3" if setup.env_file else ""
    mounts = {
        "file_mounts": file_mounts(setup),
        "cluster_synced_files": [],
        "file_mounts_sync_continuously": False,
        "rsync_exclude": _Flow([_Quoted("**/__pycache__")]),
        "rsync_filter": [],
    }
    setup_keys = {
        "setup_commands": setup_commands(setup),
        "head_setup_commands": [],
        "worker_setup_commands": [],
    }
    blocks = [
        _block(
            "Laptop -> every node. The checkout is a clean clone of the commit being run (so the "
            f"MLflow `git_sha` tag is that commit), the token is Ray's{env_file}.",
            mounts,
        ),
        _block(None, {"initialization_commands": []}),
        _block(
            f"Every node: {env}; and a login profile, the same on every node (so nodes sharing a "
            "home directory agree): that environment, token authentication, and where the sweep "
            f"driver on the head writes (checkpoints to {setup.storage}/ray_results, runs to the "
            "MLflow server on the head) and that it joins this cluster.",
            setup_keys,
            indent_lists=True,
        ),
        _block(
            "The MLflow server listens on 127.0.0.1 only (runs in ~/mlflow/mlflow.db on the head's "
            f"disk, artifacts proxied to {setup.storage}/mlflow); it is started unless already up, "
            "and `ray up` waits until it answers. `ray down` leaves it running (its pid is in "
            "~/mlflow/server.pid). The Ray dashboard is on 127.0.0.1 too.",
            {"head_start_ray_commands": head_start_commands(setup)},
            indent_lists=True,
        ),
        _block(
            None, {"worker_start_ray_commands": worker_start_commands(setup)}, indent_lists=True
        ),
    ]
    return "\n".join(blocks)


# ----------------------------------------------------------------------------- AWS

AWS_SETUP = NodeSetup(
    storage="$FUSION_RAY_S3",
    storage_check=(
        '. ~/fusion-ray.env && case "$FUSION_RAY_S3" in s3://*) ;; *) echo "~/.fusion-ray/'
        'cluster.env must export FUSION_RAY_S3=s3://BUCKET/PREFIX" >&2; exit 1;; esac'
    ),
    env_file=True,
    s3=True,
)

_AWS_IMAGE = (
    "resolve:ssm:/aws/service/deeplearning/ami/x86_64/"
    "base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"
)

#: The part of cluster.yaml above the shared sections: fixed text, no value from outside.
_AWS = f"""\
# fusion-ray on AWS with the Ray cluster launcher: `ray up cluster.yaml` (docs: "Run on a
# cluster"). Rendered by `fusion-ray cluster aws > cluster.yaml` from
# fusion_ray/launch/rayup.py, which renders the files for a lab's own machines from the same
# node setup: edit that, not this file.
# A CPU head runs the sweep driver and an MLflow tracking server, both reachable only
# through SSH port forwarding; GPU workers come and go with the autoscaler (min_workers: 0, so an
# idle cluster costs one head node). Once, on your laptop, from the checkout's root:
#
#   ray get-auth-token --generate          # Ray token authentication: every node gets this token
#   mkdir -p ~/.fusion-ray && echo "export FUSION_RAY_S3=s3://YOUR-BUCKET/fusion-ray" > ~/.fusion-ray/cluster.env
#   rm -rf ~/.fusion-ray/checkout && git clone --quiet . ~/.fusion-ray/checkout   # the commit being run
#   ray up cluster.yaml
#
# FUSION_RAY_S3 is where checkpoints (FUSION_RAY_STORAGE, read by the sweep files' storage_path)
# and MLflow artifacts go; every node reaches it through its instance profile.

cluster_name: fusion-ray

# Hard cap on worker nodes of all types together: the most the cluster can cost at once.
max_workers: 8
upscaling_speed: 1.0
# A worker idle this long is released.
idle_timeout_minutes: 10

provider:
  type: aws
  region: us-west-2
  availability_zone: us-west-2a,us-west-2b,us-west-2c
  # `ray down` stops rather than terminates on-demand nodes: the head keeps its disk (and so the
  # MLflow store) for the next `ray up`; stopped nodes cost only their EBS volumes. Spot nodes are
  # always terminated. Set false to terminate everything (copy mlflow.db off the head first).
  cache_stopped_nodes: true

auth:
  ssh_user: ubuntu

available_node_types:
  # The head: the sweep driver (Ray Tune's controller, the MLflow callback, the report), the MLflow
  # server and the Train controllers of DDP trials. CPU: 0 keeps every trial off it; the custom
  # resource is what `resources.driver_resource: {DRIVER_RESOURCE}` in a sweep file asks for (one
  # unit per DDP trial, so at most {DRIVER_SLOTS} DDP trials run at once).
  head:
    resources: {{CPU: 0, GPU: 0, {DRIVER_RESOURCE}: {DRIVER_SLOTS}}}
    node_config:
      InstanceType: m6i.2xlarge           # 8 vCPU, 32 GiB; m6i.xlarge is enough for small sweeps
      ImageId: {_AWS_IMAGE}
      BlockDeviceMappings:
        - DeviceName: /dev/sda1
          Ebs: {{VolumeSize: 100, VolumeType: gp3}}

  # One GPU: packed short-document trials. The study presets ask 0.5 GPU + 2 CPU per AG News /
  # IMDB trial, so two run on one card; an ArXiv trial (1 GPU + 4 CPU) takes a whole node.
  # Spot: a reclaimed node costs at most the epoch in flight (trials resume from their last
  # checkpoint in S3, `retries` times).
  gpu_1x:
    min_workers: 0
    max_workers: 8
    resources: {{CPU: 8, GPU: 1}}
    node_config:
      InstanceType: g5.2xlarge            # 1 x A10G (24 GB), 8 vCPU, 32 GiB
      ImageId: {_AWS_IMAGE}
      IamInstanceProfile: {{Name: ray-autoscaler-v1}}   # S3 access for checkpoints; created by `ray up`
      InstanceMarketOptions: {{MarketType: spot}}
      BlockDeviceMappings:
        - DeviceName: /dev/sda1
          Ebs: {{VolumeSize: 200, VolumeType: gp3}}

  # Four GPUs on one node: DDP on long documents (resources: {{workers: 4, use_gpu: true,
  # gpus_per_worker: 1, cpus_per_worker: 8, driver_resource: {DRIVER_RESOURCE}}}), nccl over
  # the node's own links. On-demand: a gang of four restarts together if one is lost.
  gpu_4x:
    min_workers: 0
    max_workers: 2
    resources: {{CPU: 48, GPU: 4}}
    node_config:
      InstanceType: g5.12xlarge           # 4 x A10G (24 GB), 48 vCPU, 192 GiB
      ImageId: {_AWS_IMAGE}
      IamInstanceProfile: {{Name: ray-autoscaler-v1}}
      BlockDeviceMappings:
        - DeviceName: /dev/sda1
          Ebs: {{VolumeSize: 300, VolumeType: gp3}}

head_node_type: head

"""


def render_aws() -> str:
    """cluster.yaml: an autoscaling AWS cluster (a CPU head, spot single-GPU and 4-GPU nodes)."""
    return _AWS + _shared_sections(AWS_SETUP)


# ----------------------------------------------------------------------------- a lab's machines

_HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?")
_USER = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
_NAME = re.compile(r"[A-Za-z0-9_-]+")
_WORD = re.compile(r"[A-Za-z0-9_@%+=:,./~-]+")  # needs no quoting in a shell command
_STORAGE = re.compile(r"/.*[^/].*|s3://[^/]+.*")  # an absolute path other than /, or a bucket


@dataclass(frozen=True)
class Lab:
    """A lab's own machines, as ``fusion-ray cluster onprem`` takes them."""

    head: str
    """The head's address (IP or host name), as the laptop and the workers reach it."""
    workers: tuple[str, ...]
    user: str
    """The SSH user on every node."""
    key: str
    """The laptop's private key for ``user`` (Ray copies it to the head, which starts the workers)."""
    storage: str
    """Shared by every node: an absolute path mounted at the same place on each (NFS), or
    ``s3://BUCKET/PREFIX`` (every node needs S3 credentials)."""
    python_env: str | None = None
    """An existing Python environment at this absolute path on every node; None builds ~/venv."""
    head_trials: bool = False
    """The head also runs trials with its CPUs and GPUs; False keeps it for the driver alone."""
    name: str = "fusion-ray-lab"
    ssh_proxy_command: str | None = None
    """Ray's ``auth.ssh_proxy_command`` (``%h`` is the node): a jump host or another SSH port."""
    ports: Ports = field(default_factory=Ports)

    def problems(self) -> list[str]:
        """Every reason the file could not work, each with its fix; empty when it can."""
        out = []
        for what, value, pattern, expected in [
            ("--head", self.head, _HOST, "an IP address or host name"),
            ("--user", self.user, _USER, "a user name"),
            ("--key", self.key, _WORD, "a file path without spaces or quotes"),
            ("--name", self.name, _NAME, "letters, digits, '-' and '_'"),
            *[("--workers", w, _HOST, "IP addresses or host names") for w in self.workers],
        ]:
            if not (isinstance(value, str) and pattern.fullmatch(value)):
                out.append(f"{what} {_shown(value)}: expected {expected}")
        if len(set(self.workers)) != len(self.workers) or self.head in self.workers:
            shown = _printable(",".join(map(str, self.workers)))
            out.append(f"--workers {shown}: list each node once, not the head")
        if not self.workers and not self.head_trials:
            out.append("no --workers: give some, or --head-trials so that the head runs trials")
        storage = self.storage
        if not (
            isinstance(storage, str) and _WORD.fullmatch(storage) and _STORAGE.fullmatch(storage)
        ):
            out.append(
                f"--storage {_shown(storage)}: an absolute path mounted on every node (NFS) or "
                "s3://BUCKET/PREFIX, without spaces or quotes"
            )
        env = self.python_env
        if env is not None and not (
            isinstance(env, str) and _WORD.fullmatch(env) and env.startswith("/")
        ):
            out.append(f"--python-env {_shown(env)}: an absolute path, the same on every node")
        return out + self._port_problems() + self._proxy_problems()

    def _port_problems(self) -> list[str]:
        ports = vars(self.ports)
        wrong = [name for name, p in ports.items() if type(p) is not int]  # not a bool either
        if wrong:
            return [
                f"--{name.replace('_', '-')}-port {_shown(ports[name])}: a whole number from 1 to "
                "65535"
                for name in wrong
            ]
        values = list(ports.values())
        if len(set(values)) != len(values) or not all(0 < p < 65536 for p in values):
            return [f"ports {values}: distinct numbers from 1 to 65535"]
        return []

    def _proxy_problems(self) -> list[str]:
        """The proxy command is shell code by design (ssh runs it): written as it is, on one line,
        so it may hold no character that is not printable."""
        proxy = self.ssh_proxy_command
        if proxy is None or (isinstance(proxy, str) and proxy.isprintable()):
            return []
        if not isinstance(proxy, str):
            return [f"--ssh-proxy-command {_shown(proxy)}: a command, as text"]
        bad = next(char for char in proxy if not char.isprintable())
        return [
            f"--ssh-proxy-command {_shown(proxy)}: holds {ascii(bad)[1:-1]} (a line break, control "
            "character, NUL or text that is not UTF-8); write the command on one line of "
            "printable characters"
        ]

    def setup(self) -> NodeSetup:
        """The node setup both cluster files share, with this lab's storage and head resources."""
        storage = self.storage.rstrip("/")
        check = None
        if not storage.startswith("s3://"):
            word = shell_word(storage)
            check = (
                f'test -d {word} && test -w {word} || {{ echo "{in_double_quotes(storage)} is not '
                "a writable folder on $(hostname), mount the shared storage at the same path on "
                'every node" >&2; exit 1; }'
            )
        driver = f"--resources='{{\"{DRIVER_RESOURCE}\":{DRIVER_SLOTS}}}'"
        return NodeSetup(
            storage=in_double_quotes(storage),
            storage_check=check,
            python_env=self.python_env,
            s3=storage.startswith("s3://"),
            ports=self.ports,
            head_resources=driver if self.head_trials else f"--num-cpus=0 --num-gpus=0 {driver}",
        )

    def argv(self) -> list[str]:
        """The command that renders this lab's file."""
        args = ["fusion-ray", "cluster", "onprem", *_option("--name", self.name)]
        args += [*_option("--head", self.head), *_option("--workers", ",".join(self.workers))]
        args += [*_option("--user", self.user), *_option("--key", self.key)]
        args += _option("--storage", self.storage)
        if self.python_env:
            args += _option("--python-env", self.python_env)
        if self.head_trials:
            args.append("--head-trials")
        if self.ssh_proxy_command:
            args += _option("--ssh-proxy-command", self.ssh_proxy_command)
        defaults = Ports()
        for port, value in vars(self.ports).items():
            if value != getattr(defaults, port):
                args += [f"--{port.replace('_', '-')}-port", str(value)]
        return args


def _option(flag: str, value: str) -> list[str]:
    """``flag value``, or ``flag=value`` where the value would be read as an option."""
    return [f"{flag}={value}"] if value.startswith("-") else [flag, value]


def _shown(value: object) -> str:
    """``value`` in an error message: quoted, escaped (printable), at most 80 characters."""
    text = repr(value)
    return text if len(text) <= 80 else text[:76] + "...'"


def _lab_header(lab: Lab) -> str:
    storage = (
        "S3 credentials on every node (checkpoints and MLflow artifacts go to the bucket)"
        if lab.storage.startswith("s3://")
        else f"{lab.storage} mounted, writable, at that path on every node (checkpoints, MLflow "
        "artifacts)"
    )
    python = (
        f"the Python environment {lab.python_env} on every node (Ray {RAY_VERSION} and this "
        "project's dependencies)"
        if lab.python_env
        else f"curl and internet access on every node (`ray up` installs uv, Python "
        f"{PYTHON_VERSION}, Ray {RAY_VERSION} and the project in ~/venv)"
    )
    head = "it runs trials too" if lab.head_trials else "CPU 0 and GPU 0 keep every trial off it"
    return (
        _comment(
            "fusion-ray on a lab's own machines with Ray's cluster launcher: the `local` provider "
            "reaches a fixed head and fixed workers over SSH (no autoscaling: every worker joins "
            "at `ray up`). Rendered by the command below; render your own rather than editing "
            "this file:"
        )
        + _comment_lines(f"#   {shell_join(lab.argv())} > FILE.yaml", "#")
        + _comment(
            f"What it needs: SSH for {lab.user} with {lab.key} from the laptop to every node and "
            f"from the head to the workers (Ray copies the key to the head); {python}; the NVIDIA "
            f"driver on GPU nodes (Ray counts their GPUs); {storage}. The head runs the sweep "
            f"driver, the MLflow server (127.0.0.1:{lab.ports.mlflow}) and the dashboard "
            f"(127.0.0.1:{lab.ports.dashboard}); it offers {DRIVER_SLOTS} units of "
            f"`{DRIVER_RESOURCE}` for the drivers of DDP trials, and {head}. Once, on your "
            "laptop, from the checkout's root:"
        )
        + _comment_lines(
            "#",
            "#   ray get-auth-token --generate          # Ray token authentication: every node gets this token",
            "#   rm -rf ~/.fusion-ray/checkout && git clone --quiet . ~/.fusion-ray/checkout   # the commit being run",
            "#   ray up FILE.yaml -y",
            "",
        )
    )


def render_onprem(lab: Lab) -> str:
    """A lab's cluster file: Ray's ``local`` provider, the head's resources as ``ray start`` flags,
    and the same node setup as cluster.yaml. Raises ValueError listing every problem of ``lab``."""
    problems = lab.problems()
    if problems:
        raise ValueError("cannot render the cluster file:\n  " + "\n  ".join(problems))
    auth = {"ssh_user": lab.user, "ssh_private_key": lab.key}
    if lab.ssh_proxy_command:
        auth["ssh_proxy_command"] = lab.ssh_proxy_command
    provider = {"type": "local", "head_ip": lab.head, "worker_ips": list(lab.workers)}
    blocks = [
        _block(None, {"cluster_name": lab.name}),
        _block(
            "The head's autoscaler starts every worker right after `ray up` and keeps it "
            "(min_workers = max_workers = the number of worker_ips).",
            {"provider": provider},
        ),
        _block(None, {"auth": auth}),
        _shared_sections(lab.setup()),
    ]
    return _lab_header(lab) + "\n".join(blocks)


#: The committed example, cluster-onprem.yaml (documentation addresses, RFC 5737).
EXAMPLE_LAB = Lab(
    head="192.0.2.10",
    workers=("192.0.2.11", "192.0.2.12"),
    user="lab",
    key="~/.ssh/id_ed25519",
    storage="/mnt/shared/fusion-ray",
)


# ----------------------------------------------------------------------------- the targets


RAY_UP_SHELL_KEYS = (
    "initialization_commands",
    "setup_commands",
    "head_setup_commands",
    "worker_setup_commands",
    "head_start_ray_commands",
    "worker_start_ray_commands",
)
"""The keys of a ``ray up`` file whose commands a shell runs on the nodes."""


class AwsTarget(LaunchTarget):
    """cluster.yaml: an autoscaling AWS cluster (a CPU head, spot single-GPU and 4-GPU nodes)
    for ``ray up``; sweeps then run on its head."""

    summary = "print cluster.yaml (AWS, autoscaling) for ray up"
    shell_keys = RAY_UP_SHELL_KEYS
    output = "yaml"
    runs_sweep = False

    def render(self, args: argparse.Namespace) -> str:
        return render_aws()


class OnpremTarget(LaunchTarget):
    """A cluster file for a lab's own machines (Ray's ``local`` provider over SSH) for
    ``ray up``; sweeps then run on its head."""

    summary = "print a cluster file for a lab's own machines (ray up over SSH)"
    shell_keys = RAY_UP_SHELL_KEYS
    code_options = ("--ssh-proxy-command",)  # ssh runs it through a shell, as written
    output = "yaml"
    runs_sweep = False

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add = parser.add_argument
        add("--head", required=True, help="the head's address (IP or host name)")
        add(
            "--workers",
            action="append",
            default=[],
            help="worker addresses, comma-separated (repeatable); none with --head-trials",
        )
        add("--user", required=True, help="the SSH user on every node")
        add("--key", required=True, help="the laptop's private SSH key for that user")
        add(
            "--storage",
            required=True,
            help="shared by every node: an absolute path mounted at the same place (NFS) or "
            "s3://BUCKET/PREFIX",
        )
        add(
            "--python-env",
            default=None,
            help="an existing Python environment at this absolute path on every node (Ray "
            f"{RAY_VERSION} and the project's dependencies); default: ray up builds ~/venv with uv",
        )
        add(
            "--head-trials",
            action="store_true",
            help="the head runs trials too (its CPUs and GPUs)",
        )
        add("--name", default="fusion-ray-lab", help="the Ray cluster name")
        add(
            "--ssh-proxy-command",
            default=None,
            help='Ray\'s auth.ssh_proxy_command, e.g. "ssh -W %%h:%%p gateway" or "nc %%h 2222"',
        )
        for port, value in vars(Ports()).items():
            name = port.replace("_", " ")
            add(
                f"--{port.replace('_', '-')}-port", type=int, default=value, help=f"the {name} port"
            )

    def render(self, args: argparse.Namespace) -> str:
        lab = Lab(
            head=args.head,
            workers=tuple(w for arg in args.workers for w in arg.split(",") if w),
            user=args.user,
            key=args.key,
            storage=args.storage,
            python_env=args.python_env,
            head_trials=args.head_trials,
            name=args.name,
            ssh_proxy_command=args.ssh_proxy_command,
            ports=Ports(**{p: getattr(args, f"{p}_port") for p in vars(Ports())}),
        )
        return render_onprem(lab)

    def example_args(self) -> list[str]:
        return EXAMPLE_LAB.argv()[3:]
