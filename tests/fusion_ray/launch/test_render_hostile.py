"""Hostile values in every input of ``fusion-ray cluster slurm``, ``k8s`` and ``onprem``
(newlines, carriage returns, quotes, ``$(...)``, backquotes, ``---``, ``#``, backslashes, Unicode
line separators, undecodable bytes, very long text): each renderer refuses the value with an
error naming its flag, or writes it where it belongs and nowhere else.

The SLURM script, read as sbatch and bash read it: every line before the first ``#SBATCH`` is a
comment (and, run, runs nothing); the ``#SBATCH`` lines, split the way sbatch splits them
(``_get_argument`` in SLURM's src/sbatch/opt.c), hold exactly the options the job asks for, one a
line; the whole file is printable text; it parses (``bash -n``); run with stand-ins for srun,
scontrol, ray and python on an otherwise empty PATH, it gives the sweep driver each value as
exactly one argument with its exact text, enters the exact workdir, makes and removes the exact
node temp dir, hands ``--activate`` and ``--node-ip-command`` to ``eval`` as one word each, and
runs nothing else (a ``canary`` and a ``touch`` on PATH record any call). The header's command
renders the same script again. The manifest: ``yaml.safe_load_all`` gives one document of the
same shape as a benign render's, the value exactly where it belongs, and the entrypoint, split
by shlex, the exact words. A lab's cluster file: printable text, comment lines only above
``cluster_name``, one YAML document of a benign render's shape with the value exactly where it
belongs, the shell commands holding it giving it back as one word when split, and the header's
command rendering the same file again.

The values: fixed payloads (among them the ones that broke the renderers: a newline in an
override, in the sweep file's name or in --workdir ending the header comment ahead of the
#SBATCH lines or starting a second YAML document; a quote or ``$(...)`` in --node-tmp; a space
in --output; a carriage return or U+2028 in --ssh-proxy-command ending the lab file's header
comment, the rest read as YAML keys) and strings drawn from them by a seeded generator (the same every run).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import random
import re
import shlex
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from fusion_ray.launch import k8s, slurm
from fusion_ray.launch import main as cluster_main
from fusion_ray.launch.k8s import KubeJob, manifest, render_k8s
from fusion_ray.launch.rayup import Lab, Ports, render_onprem
from fusion_ray.launch.shell import in_double_quotes
from fusion_ray.launch.slurm import SlurmJob, render_slurm

PAYLOADS = (
    "\n", "\r", "\r\n", "\t", "\x0b", "\x0c", "\x1b[31m", "\x7f", "\x85", "\u2028", "\u2029",
    "\ufeff", "\udcff", "'", '"', "\\", "\\n", "$(canary)", "`canary`", "${IFS}", "$HOME",
    "'$(canary)'", '"$(canary)"', "$'\\n'", "${x:-$(canary)}", "; canary;", "&& canary",
    "| canary", "> canary.out", "\ncanary #", "\ntouch /tmp/x #", "\n#SBATCH --wrap=canary\n",
    "\n---\nkind: ClusterRoleBinding\nmetadata: {name: x}\n", "---", "...", "#", " # ", " ",
    "%j", "{", "}", "*", "?", "[a]", "~", "!", "-", "--no-report", "--address=evil:1", ":",
    "packjob", "@SWEEP@", "é", "中文", "..", "/", "=", "&", "<", "(", ")", "${",
)  # fmt: skip
#: Ordinary characters mixed in by the generator.
PLAIN = tuple("abxyz019_.-/=")
#: One very long value (11,000 characters).
LONG = "x'\n$(canary)\u2028#\"" * 1000


def hostile(field: str, count: int = 30) -> list[str]:
    """The payloads, ``count`` strings drawn from them (seeded by ``field``) and LONG."""
    rng = random.Random(f"hostile {field}")
    pool = PAYLOADS + PLAIN * 2
    drawn = ["".join(rng.choices(pool, k=rng.randint(2, 7))) for _ in range(count)]
    return [*PAYLOADS, *drawn, LONG]


def _printable_lines(text: str) -> bool:
    return all(char.isprintable() or char == "\n" for char in text)


def _refused_or_rendered(render: Callable[[Any], str], job: Any, *flags: str) -> str | None:
    """The rendered text, or None when ``render`` refused ``job`` with an error naming one of
    ``flags``."""
    try:
        return render(job)
    except ValueError as exc:
        assert any(flag in str(exc) for flag in flags), f"the error names none of {flags}: {exc}"
        return None


# ----------------------------------------------------------------------------- SLURM: fields

SLURM_BASE = SlurmJob(
    sweep_file="sweeps/tiny.yaml",
    overrides=("train.epochs=1",),
    node_ip_command="echo 127.0.0.1",
    port=23456,
)


@dataclass(frozen=True)
class SlurmField:
    """One input of the SLURM renderer: its flag (as errors name it) and the job's fields that
    carry a value."""

    flag: str
    changes: Callable[[str], dict[str, Any]]
    #: shell code by design: given to eval, so the run checks what eval receives
    code: bool = False

    def job(self, value: str) -> SlurmJob:
        return dataclasses.replace(SLURM_BASE, **self.changes(value))


SLURM_FIELDS = {
    "sweep_file": SlurmField("the sweep file", lambda v: {"sweep_file": v}),
    "override": SlurmField("override 2", lambda v: {"overrides": ("train.epochs=1", v)}),
    "override_value": SlurmField(
        "override 2", lambda v: {"overrides": ("train.epochs=1", "note.text=" + v)}
    ),
    "workdir": SlurmField("--workdir", lambda v: {"workdir": "/w/" + v}),
    "node_tmp": SlurmField("--node-tmp", lambda v: {"node_tmp": "/nt/" + v}),
    "output": SlurmField("--output", lambda v: {"output": "logs/" + v}),
    "job_name": SlurmField("--job-name", lambda v: {"job_name": v}),
    "partition": SlurmField("--partition", lambda v: {"partition": v}),
    "account": SlurmField("--account", lambda v: {"account": v}),
    "mem": SlurmField("--mem", lambda v: {"mem": v}),
    "time": SlurmField("--time", lambda v: {"time": v}),
    "activate": SlurmField("--activate", lambda v: {"activate": v}, code=True),
    "node_ip_command": SlurmField("--node-ip-command", lambda v: {"node_ip_command": v}, code=True),
}
#: Fields the process test gives one value at once (one run checks them together; a value one
#: of them refuses is tried in each alone), and whether the job is run (the others reach only
#: the directives and the header).
RUN_GROUPS = {
    ("sweep_file", "override_value", "workdir"): True,
    ("activate", "node_ip_command"): True,
    ("node_tmp",): True,
    ("override",): True,
    ("output",): False,
    ("job_name",): False,
    ("partition",): False,
    ("account",): False,
    ("mem",): False,
    ("time",): False,
}


# ----------------------------------------------------------------------------- SLURM: sbatch

_C_SPACE = " \t\n\v\f\r"  # isspace() in the C locale


def _sbatch_arguments(text: str) -> list[str]:
    """The options sbatch reads from the rest of one ``#SBATCH`` line (``_get_argument``)."""
    args: list[str] = []
    at = 0
    while True:
        while at < len(text) and text[at] in _C_SPACE:
            at += 1
        assert not text.startswith(":", at), f"sbatch: unexpected ':' in {text!r}"
        arg, at = _sbatch_argument(text, at)
        if not arg:
            return args
        args.append(arg)


def _sbatch_argument(text: str, at: int) -> tuple[str, int]:
    """One option from ``at``: up to whitespace outside quotes; quotes group and vanish, '\\'
    escapes the next character, an unquoted '#' ends the line."""
    arg: list[str] = []
    quote, escape = "", False
    while at < len(text) and (quote or text[at] not in _C_SPACE):
        char = text[at]
        at += 1
        if escape:
            escape = False
        elif char == "\\":
            escape = True
            continue
        elif quote and char == quote:
            quote = ""
            continue
        elif not quote and char in "\"'":
            quote = char
            continue
        elif not quote and char == "#":
            return "".join(arg), len(text)
        arg.append(char)
    assert not quote, f"sbatch: unmatched {quote} in {text!r}"
    return "".join(arg), at


def sbatch_directives(script: str) -> list[list[str]]:
    """The options of each directive line, as sbatch reads them (``_opt_batch_script``): lines
    from the top until the first that is neither blank nor a comment."""
    out = []
    for line in script.split("\n"):
        if line.startswith(("#SBATCH", "#SLURM")):
            lower = line.lower()
            assert "packjob" not in lower and "hetjob" not in lower, f"a job separator: {line!r}"
            out.append(_sbatch_arguments(line.removeprefix("#SBATCH").removeprefix("#SLURM")))
            continue
        stripped = line.lstrip(_C_SPACE)
        if stripped and not stripped.startswith("#"):
            break
    return out


def expected_directives(job: SlurmJob) -> list[str]:
    """The options the job asks sbatch for, spelled out here from its fields."""
    out = [
        f"--job-name={job.job_name}",
        f"--nodes={job.nodes}",
        "--ntasks-per-node=1",
        f"--cpus-per-task={job.cpus_per_node}",
        f"--time={job.time}",
        f"--signal=B:USR1@{job.signal_seconds}",
        "--requeue" if job.requeue else "--no-requeue",
        "--open-mode=append",
        f"--output={job.output}",
    ]
    if job.gpus_per_node:
        out.append(f"--gres=gpu:{job.gpus_per_node}")
    out += [f"--{name}={value}" for name, value in
            [("mem", job.mem), ("partition", job.partition), ("account", job.account)] if value]  # fmt: skip
    return sorted(out)


def check_slurm_text(script: str, job: SlurmJob) -> None:
    """What sbatch sees: printable text, comments only before the directives, each directive
    line one option, the options exactly the job's; no #PBS/#BSUB line (sbatch reads those too);
    the sweep command on one line."""
    assert _printable_lines(script), "a control character or line separator in the script"
    lines = script.split("\n")
    first = next(i for i, line in enumerate(lines) if line.startswith("#SBATCH"))
    assert lines[0] == "#!/bin/bash"
    assert all(line.startswith("#") for line in lines[:first]), lines[:first]
    directives = sbatch_directives(script)
    assert all(len(options) == 1 for options in directives), directives
    assert sorted(options[0] for options in directives) == expected_directives(job)
    assert not [line for line in lines if line.startswith(("#PBS", "#BSUB"))]
    (driver,) = [line for line in lines if "python -m fusion_ray.sweep" in line]
    assert driver.rstrip().endswith("&")


# ----------------------------------------------------------------------------- SLURM: unit


@pytest.mark.unit
@pytest.mark.parametrize("field", SLURM_FIELDS)
def test_slurm_hostile_values_are_refused_or_stay_out_of_the_directives(field):
    spec = SLURM_FIELDS[field]
    rendered = 0
    for value in hostile(field):
        job = spec.job(value)
        script = _refused_or_rendered(render_slurm, job, spec.flag)
        if script is not None:
            check_slurm_text(script, job)
            rendered += 1
    if field in ("sweep_file", "override_value", "workdir", "activate", "node_ip_command"):
        assert rendered > 40, "most values are legal here: the check must see them rendered"


@pytest.mark.unit
@pytest.mark.parametrize(
    ("field", "value"),
    [("override", "seeds=[0]\ntouch /tmp/x #"), ("sweep_file", "tiny.yaml\ntouch /tmp/x #"),
     ("workdir", "w\ntouch /tmp/x #"), ("output", "job out.log"), ("output", "a.out\n--wrap=x"),
     ("job_name", "packjob"), ("time", "30\n#SBATCH --wrap=x")],
)  # fmt: skip
def test_slurm_reproductions_keep_every_directive(field, value):
    """A newline in an override, the sweep file's name or --workdir used to end the header's
    comment ahead of every #SBATCH line (sbatch then ignored them all); a space in --output put
    a second option on its line."""
    spec = SLURM_FIELDS[field]
    job = spec.job(value)
    script = _refused_or_rendered(render_slurm, job, spec.flag)
    if script is not None:
        check_slurm_text(script, job)


@pytest.mark.unit
@pytest.mark.parametrize("field", SLURM_FIELDS)
def test_slurm_a_nul_is_refused_naming_the_flag(field):
    spec = SLURM_FIELDS[field]
    with pytest.raises(ValueError, match=re.escape(spec.flag)):
        render_slurm(spec.job("a\0b"))


@pytest.mark.unit
def test_the_node_tmp_grammar():
    ok = ["${SLURM_TMPDIR:-${TMPDIR:-/tmp}}", "/scratch/my dir", "$HOME/x", "${A}/b", "${A-/t}",
          "${A:-}", "~/x"]  # fmt: skip
    bad = ["${A", "${A:-x", "$(id)", "a'b", 'a"b', "a}b", "`id`", "$1", "${#A}", "${A/x/y}",
           "$", "a\\b", "${a:-" * 3000, "a\nb", " "]  # fmt: skip
    assert [t for t in ok if slurm.node_tmp_problem(t)] == []
    assert [t for t in bad if not slurm.node_tmp_problem(t)] == []


@pytest.mark.unit
def test_a_value_holding_a_placeholder_name_stays_as_it_is():
    """The template is filled in one pass: a value that spells another placeholder is not
    filled in again."""
    job = dataclasses.replace(SLURM_BASE, sweep_file="@REQUEUES@.yaml", overrides=("a=@NODE_TMP@",))
    script = render_slurm(job)
    assert "python -m fusion_ray.sweep @REQUEUES@.yaml a=@NODE_TMP@ --address" in script


# ----------------------------------------------------------------------------- SLURM: bash

SHIMS = {
    # the sweep driver, the token and the join step; the driver records its argv and folder
    "python": """case "$1 $2" in
    "-c "*) echo 0123456789abcdef ;;
    "-m fusion_ray.launch.join")  # the nodes have joined once the head's Ray has started
        until [ -e "$RECORD/ray.argv" ]; do sleep 0.01; done ;;
    "-m fusion_ray.sweep") printf '%s\\0' "$@" > "$RECORD/driver.argv"
                           printf '%s' "$PWD" > "$RECORD/driver.cwd" ;;
    *) echo "unexpected python $*" >&2; exit 1 ;;
esac""",
    "ray": """for a in "$@"; do
    case $a in --temp-dir=*) [ -d "${a#--temp-dir=}" ] && : > "$RECORD/tmp.made" ;; esac
done
printf '%s\\0' "$@" > "$RECORD/ray.argv"
""",
    "srun": """while [ $# -gt 0 ] && [[ $1 == --* ]]; do shift; done
exec "$@"
""",
    "scontrol": """[ "$1" = show ] && { echo n1; exit 0; }
printf '%s\\0' "$@" >> "$RECORD/scontrol.argv"
""",
    "hostname": "echo n1",
    # what a hostile value would run: recorded
    "canary": 'printf "%s\\n" "$0 $*" >> "$INJECTED"',
    "touch": 'printf "%s\\n" "$0 $*" >> "$INJECTED"',
}
#: Stands in for the builtin in the cases of --activate and --node-ip-command: records what
#: the script hands to eval (code by design) instead of running it.
EVAL_RECORDER = '() { printf "%s\\0" "$@" > "$RECORD/eval.$BASHPID.$RANDOM"; }'

RUNNER = r"""
set -u
for case in "$@"; do
    cd "$case" || exit 90
    bash -n job.sh 2> parse.err; echo $? > parse.rc
    env -i PATH="$SHIM_PATH" INJECTED="$INJECTED" bash prefix.sh > prefix.out 2>&1
    echo $? > prefix.rc
    if [ -f run ]; then
        extra=()
        [ -f code ] && extra=("BASH_FUNC_eval%%=$EVAL_RECORDER")
        env -i PATH="$SHIM_PATH" INJECTED="$INJECTED" RECORD="$case/rec" HOME="$ROOT/home" \
            TMPDIR="$ROOT/tmp" SLURM_JOB_ID=4242 SLURMD_NODENAME=n1 SLURM_JOB_NODELIST=n1 \
            SLURM_SUBMIT_DIR="$ROOT/submit" LC_ALL=C.UTF-8 "BASH_FUNC_date%%=$DATE" "${extra[@]}" \
            bash job.sh > run.out 2> run.err
        echo $? > run.rc
    fi
    cd "$ROOT"
done
"""


def _shim_path(root: Path) -> Path:
    bin_dir = root / "bin"
    bin_dir.mkdir(parents=True)
    for name, body in SHIMS.items():
        (bin_dir / name).write_text("#!/bin/bash\n" + body + "\n")
        (bin_dir / name).chmod(0o755)
    for tool in ("bash", "mkdir", "rm", "sleep"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    for folder in ("home", "tmp", "submit"):
        (root / folder).mkdir()
    return bin_dir


def _component(value: str) -> str:
    """``value`` as one folder name that exists on disk: no '/', at most 60 characters."""
    return "d" + value.replace("/", "_")[:60]


@dataclass
class SlurmCase:
    fields: tuple[str, ...]
    value: str
    job: SlurmJob
    folder: Path
    script: str
    workdir: Path | None = None
    temp_dir: str | None = None

    @property
    def code(self) -> bool:
        return any(SLURM_FIELDS[field].code for field in self.fields)


def _prepare(
    root: Path, index: int, fields: tuple[str, ...], value: str, run: bool = True
) -> SlurmCase | None:
    """The case's folder (its script, the lines before the first #SBATCH, and whether it is
    run), with ``value`` in each of ``fields``; None when the renderer refuses it."""
    changes: dict[str, Any] = {}
    for field in fields:
        changes.update(SLURM_FIELDS[field].changes(value))
    workdir = None
    temp_dir: str | None = f"{root}/tmp/fr-4242-n1"  # the default --node-tmp: $TMPDIR here
    if "workdir" in fields:  # a folder that exists: the script enters it
        workdir = root / "w" / _component(value)
        workdir.mkdir(parents=True, exist_ok=True)
        changes["workdir"] = str(workdir)
    if "node_tmp" in fields:
        changes["node_tmp"] = node_tmp = str(root / "nt" / _component(value))
        # expanded on the node: exact where nothing is to expand (the grammar has its own test)
        temp_dir = f"{node_tmp}/fr-4242-n1" if "$" not in value else None
    job = dataclasses.replace(SLURM_BASE, **changes)
    flags = [SLURM_FIELDS[field].flag for field in fields]
    script = _refused_or_rendered(render_slurm, job, *flags)
    if script is None:
        return None
    folder = root / f"case-{index}"
    (folder / "rec").mkdir(parents=True)
    (folder / "job.sh").write_text(script, encoding="utf-8")
    lines = script.split("\n")
    first = next(i for i, line in enumerate(lines) if line.startswith("#SBATCH"))
    (folder / "prefix.sh").write_text("\n".join(lines[:first]) + "\n", encoding="utf-8")
    case = SlurmCase(fields, value, job, folder, script, workdir, temp_dir)
    if run:
        (folder / "run").touch()
    if case.code:
        (folder / "code").touch()
    return case


def _run_cases(root: Path, cases: list[SlurmCase]) -> None:
    env = {
        "PATH": os.environ["PATH"],
        "SHIM_PATH": str(root / "bin"),
        "INJECTED": str(root / "injected.log"),
        "EVAL_RECORDER": EVAL_RECORDER,
        "DATE": "() { echo 00:00:00; }",  # the log lines' clock, without a process each
        "ROOT": str(root),
    }
    folders = [str(case.folder) for case in cases]
    done = subprocess.run(
        ["bash", "-c", RUNNER, "runner", *folders], env=env, capture_output=True, timeout=600
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")


def _nul_words(path: Path) -> list[str]:
    return path.read_bytes().decode("utf-8", "surrogateescape").split("\0")[:-1]


def _check_run(case: SlurmCase) -> None:
    folder, job = case.folder, case.job
    what = f"{'+'.join(case.fields)}={case.value[:60]!r}"
    assert (folder / "parse.rc").read_text().strip() == "0", (folder / "parse.err").read_text()
    assert (folder / "prefix.rc").read_text().strip() == "0", what
    assert (folder / "prefix.out").read_text() == "", what  # the comments ran nothing
    made = {p.name for p in folder.iterdir()} - {"job.sh", "prefix.sh", "run", "code", "rec"}
    outputs = {"parse.rc", "parse.err", "prefix.rc", "prefix.out"}
    if not (folder / "run").exists():
        assert made == outputs, f"{what}: a file was made in the job's folder: {made - outputs}"
        return
    outputs |= {"run.rc", "run.out", "run.err"}
    assert made == outputs, f"{what}: a file was made in the job's folder: {made - outputs}"
    err = (folder / "run.err").read_bytes().decode(errors="replace")
    assert (folder / "run.rc").read_text().strip() == "0", f"{what}: {err[-2000:]}"
    assert "command not found" not in err and "unexpected python" not in err, f"{what}: {err}"
    rec = folder / "rec"
    ip = "" if case.code else "127.0.0.1"
    expected = ["-m", "fusion_ray.sweep", job.sweep_file, *job.overrides]
    expected += ["--address", f"{ip}:23456"]
    assert _nul_words(rec / "driver.argv") == expected, what
    cwd = (rec / "driver.cwd").read_bytes().decode("utf-8", "surrogateescape")
    assert cwd == str(case.workdir or folder.parent / "submit"), what
    ray = _nul_words(rec / "ray.argv")
    assert f"--node-ip-address={ip}" in ray and "--head" in ray, what
    if case.temp_dir is not None:
        assert f"--temp-dir={case.temp_dir}" in ray, what
        assert (rec / "tmp.made").exists(), f"{what}: the temp dir was not made"
        assert not Path(case.temp_dir).exists(), f"{what}: the temp dir was not removed"
    if case.code:
        calls = {tuple(_nul_words(p)) for p in rec.glob("eval.*")}
        code = {("--", job.activate), ("--", job.node_ip_command)} - {("--", None)}
        assert calls == code, f"{what}: eval got {calls}"


@pytest.mark.process  # runs bash on each script: bash -n, the header, a run with stand-ins
def test_slurm_scripts_with_hostile_values_parse_and_pass_each_value_exactly(tmp_path):
    root = tmp_path
    _shim_path(root)
    cases = []
    for fields, run in RUN_GROUPS.items():
        for value in hostile("+".join(fields), count=4):
            case = _prepare(root, len(cases), fields, value, run)
            if case is not None:
                cases.append(case)
            elif len(fields) > 1:  # refused by one of them: each alone
                for field in fields:
                    alone = _prepare(root, len(cases), (field,), value, run)
                    cases += [alone] if alone is not None else []
    _run_cases(root, cases)
    injected = root / "injected.log"
    assert not injected.exists(), injected.read_text()
    for case in cases:
        _check_run(case)
    fields = {field for case in cases for field in case.fields}
    assert fields >= {"sweep_file", "override_value", "workdir", "node_tmp", "activate",
                      "node_ip_command", "output", "job_name"}  # fmt: skip
    _check_headers(root, [case.script for case in cases], "slurm", slurm.main)


def _check_headers(root: Path, texts: list[str], target: str, main: Callable) -> None:
    """Each header's command, its words read by bash (canary on PATH), renders the same text."""
    lines = []
    for text in texts:
        (line,) = re.findall(rf"^#   (fusion-ray cluster {target} .*)$", text, re.M)
        lines.append(f"printf '%s\\0' {line}; printf '\\1\\0'")
    (root / "headers.sh").write_text("\n".join(lines) + "\n", encoding="utf-8")
    done = subprocess.run(
        ["bash", str(root / "headers.sh")],
        env={"PATH": str(root / "bin"), "INJECTED": str(root / "injected.log")},
        capture_output=True,
        timeout=120,
    )
    assert done.returncode == 0 and not done.stderr, done.stderr
    assert not (root / "injected.log").exists()
    words = done.stdout.decode("utf-8", "surrogateescape").split("\0")[:-1]
    commands, current = [], []
    for word in words:
        if word == "\1":
            commands.append(current)
            current = []
        else:
            current.append(word)
    assert len(commands) == len(texts)
    for command, text in zip(commands, texts, strict=True):
        assert command[:3] == ["fusion-ray", "cluster", target]
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert main(command[3:]) == 0
        assert out.getvalue() == text


@pytest.mark.process
@pytest.mark.parametrize(
    ("field", "value"),
    [("override", "seeds=[0]\ntouch /tmp/x #"), ("node_tmp", "it's"),
     ("node_tmp", 'x"$(canary)"'), ("node_tmp", "$(canary)")],
)  # fmt: skip
def test_slurm_reproductions_run_nothing(tmp_path, field, value):
    """The commands that injected a command before: a newline in an override (the header's
    comment ended, the rest ran ahead of the directives), and --node-tmp with a quote (the
    script no longer parsed) or with "$(...)" (pasted into "...", it ran)."""
    _shim_path(tmp_path)
    case = _prepare(tmp_path, 0, (field,), value)
    if case is None:
        return  # refused, naming the flag
    _run_cases(tmp_path, [case])
    assert not (tmp_path / "injected.log").exists(), (tmp_path / "injected.log").read_text()
    _check_run(case)


# ----------------------------------------------------------------------------- Kubernetes


def _kube(**changes: Any) -> KubeJob:
    base = KubeJob(
        sweep_file="sweeps/tiny.yaml",
        image="lab/fusion-ray:1",
        overrides=("train.epochs=1",),
        namespace="lab",
        storage="pvc:shared",
    )
    return dataclasses.replace(base, **changes)


def _containers(doc: dict) -> list[dict]:
    spec = doc["spec"]
    cluster = spec["rayClusterSpec"]
    templates = [spec["submitterPodTemplate"], cluster["headGroupSpec"]["template"]]
    templates += [group["template"] for group in cluster["workerGroupSpecs"]]
    return [c for t in templates for c in t["spec"]["containers"]]


def _ray_containers(doc: dict) -> list[dict]:
    return [c for c in _containers(doc) if c["name"] != "ray-job-submitter"]


def _env_values(doc: dict, name: str) -> list[str]:
    return [e["value"] for c in _ray_containers(doc) for e in c["env"] if e["name"] == name]


def _claims(doc: dict) -> list[str]:
    cluster = doc["spec"]["rayClusterSpec"]
    templates = [cluster["headGroupSpec"]["template"]]
    templates += [group["template"] for group in cluster["workerGroupSpecs"]]
    return [
        v["persistentVolumeClaim"]["claimName"] for t in templates for v in t["spec"]["volumes"]
    ]


def _secret_names(doc: dict) -> list[str]:
    return [e["valueFrom"]["secretKeyRef"]["name"] for c in _containers(doc) for e in c["env"]
            if "valueFrom" in e]  # fmt: skip


@dataclass(frozen=True)
class KubeField:
    flag: str
    job: Callable[[str], KubeJob]
    benign: str
    #: where the value must be in the manifest: (what is there, what must be there)
    where: Callable[[dict, str], tuple[Any, Any]]


def _words(doc: dict) -> list[str]:
    return shlex.split(doc["spec"]["entrypoint"])


KUBE_FIELDS = {
    "sweep_file": KubeField(
        "the sweep file", lambda v: _kube(sweep_file=v), "s.yaml",
        lambda d, v: (_words(d)[3], v),
    ),
    "override": KubeField(
        "override 2", lambda v: _kube(overrides=("train.epochs=1", "note.text=" + v)), "x",
        lambda d, v: (_words(d)[4:], ["train.epochs=1", "note.text=" + v]),
    ),
    "image": KubeField(
        "--image", lambda v: _kube(image=v), "img",
        lambda d, v: ({c["image"] for c in _containers(d)}, {v}),
    ),
    "workdir": KubeField(
        "--workdir", lambda v: _kube(workdir="/w/" + v), "x",
        lambda d, v: ({c["workingDir"] for c in _ray_containers(d)}, {"/w/" + v}),
    ),
    "name": KubeField(
        "--name", lambda v: _kube(name=v), "x", lambda d, v: (d["metadata"]["name"], v)
    ),
    "namespace": KubeField(
        "--namespace", lambda v: _kube(namespace=v), "x",
        lambda d, v: (d["metadata"]["namespace"], v),
    ),
    "memory_per_worker": KubeField(
        "--memory-per-worker", lambda v: _kube(memory_per_worker=v), "1Gi",
        lambda d, v: (_ray_containers(d)[-1]["resources"]["limits"]["memory"], v),
    ),
    "head_memory": KubeField(
        "--head-memory", lambda v: _kube(head_memory=v), "1Gi",
        lambda d, v: (_ray_containers(d)[0]["resources"]["limits"]["memory"], v),
    ),
    "gpu_resource": KubeField(
        "--gpu-resource", lambda v: _kube(gpu_resource=v), "example.com/x",
        lambda d, v: (v in _ray_containers(d)[-1]["resources"]["limits"], True),
    ),
    "token_secret": KubeField(
        "--token-secret", lambda v: _kube(token_secret=v), "x",
        lambda d, v: (v in _secret_names(d), True),
    ),
    "tracking_secret": KubeField(
        "--tracking-secret", lambda v: _kube(tracking_secret=v), "x",
        lambda d, v: (v in _secret_names(d), True),
    ),
    "storage_pvc": KubeField(
        "--storage", lambda v: _kube(storage="pvc:" + v), "x",
        lambda d, v: (set(_claims(d)), {v}),
    ),
    "storage_s3": KubeField(
        "--storage", lambda v: _kube(storage="s3://bucket/" + v), "x",
        lambda d, v: (set(_env_values(d, "FUSION_RAY_STORAGE")),
                      {("s3://bucket/" + v).rstrip("/") + "/ray_results"}),
    ),
    "s3_secret": KubeField(
        "--s3-secret", lambda v: _kube(storage="s3://b/p", s3_secret=v), "x",
        lambda d, v: ({c["envFrom"][0]["secretRef"]["name"] for c in _ray_containers(d)}, {v}),
    ),
}  # fmt: skip


def _shape(value: Any, gpu: str) -> Any:
    """``value`` with every string value replaced by "<str>" (and the GPU resource's key)."""
    if isinstance(value, dict):
        return {("<gpu>" if k == gpu else k): _shape(v, gpu) for k, v in value.items()}
    if isinstance(value, list):
        return [_shape(v, gpu) for v in value]
    return "<str>" if isinstance(value, str) else value


_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def check_manifest(text: str, job: KubeJob, benign_shape: Any) -> dict:
    """One YAML document of the benign render's shape, after comment lines of printable text
    only; the entrypoint's words are the sweep's."""
    assert _printable_lines(text), "a control character or line separator in the manifest"
    lines = text.split("\n")
    body = next(i for i, line in enumerate(lines) if not line.startswith("#"))
    assert lines[body].startswith("apiVersion:"), lines[: body + 1]
    docs = list(yaml.load_all(text, Loader=_LOADER))
    assert len(docs) == 1, f"{len(docs)} documents"
    (doc,) = docs
    assert _shape(doc, job.gpu_resource) == benign_shape
    words = ["python", "-m", "fusion_ray.sweep", job.sweep_file, *job.overrides]
    assert _words(doc) == words + ([] if job.report else ["--no-report"])
    return doc


@pytest.mark.unit
@pytest.mark.parametrize("field", KUBE_FIELDS)
def test_k8s_hostile_values_are_refused_or_serialised_where_they_belong(field):
    spec = KUBE_FIELDS[field]
    benign = spec.job(spec.benign)
    benign_shape = _shape(manifest(benign), benign.gpu_resource)
    rendered = 0
    for value in hostile(field):
        job = spec.job(value)
        text = _refused_or_rendered(render_k8s, job, spec.flag)
        if text is None:
            continue
        doc = check_manifest(text, job, benign_shape)
        found, wanted = spec.where(doc, value)
        assert found == wanted, (field, value[:60])
        rendered += 1
    if field in ("sweep_file", "override", "workdir"):
        assert rendered > 40, "most values are legal here: the check must see them rendered"


@pytest.mark.unit
@pytest.mark.parametrize(
    "field", ["workdir", "override", "sweep_file", "gpu_resource", "image", "storage_s3"]
)
def test_k8s_reproduction_a_newline_starts_no_second_document(field):
    """A newline in --workdir, an override, the sweep file's name or --gpu-resource used to
    start YAML of its own after the header comment (a ClusterRoleBinding was applied so)."""
    spec = KUBE_FIELDS[field]
    value = "x\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\n"
    text = _refused_or_rendered(render_k8s, spec.job(value), spec.flag)
    if text is not None:
        benign = spec.job(spec.benign)
        check_manifest(text, spec.job(value), _shape(manifest(benign), benign.gpu_resource))
        assert "ClusterRoleBinding" not in [d.get("kind") for d in yaml.safe_load_all(text)]


@pytest.mark.unit
@pytest.mark.parametrize("field", KUBE_FIELDS)
def test_k8s_a_nul_or_a_lone_surrogate_is_refused_naming_the_flag(field):
    spec = KUBE_FIELDS[field]
    for value in ("a\0b", "a\udcffb"):
        with pytest.raises(ValueError, match=re.escape(spec.flag)):
            render_k8s(spec.job(value))


@pytest.mark.process  # bash reads the header's command
def test_k8s_header_commands_with_hostile_values_render_the_same_manifest(tmp_path):
    _shim_path(tmp_path)
    texts = []
    for field, spec in KUBE_FIELDS.items():
        for value in hostile(field, count=2):
            text = _refused_or_rendered(render_k8s, spec.job(value), spec.flag)
            if text is not None:
                texts.append(text)
    _check_headers(tmp_path, texts, "k8s", k8s.main)


# ----------------------------------------------------------------------------- on-prem and AWS

LAB_BASE = Lab(
    head="10.0.0.1",
    workers=("10.0.0.2",),
    user="lab",
    key="~/.ssh/id_ed25519",
    storage="/mnt/shared/fusion-ray",
)


def _lab(**changes: Any) -> Lab:
    return dataclasses.replace(LAB_BASE, **changes)


def _setup_command(doc: dict, start: str) -> str:
    (command,) = [c for c in doc["setup_commands"] if c.startswith(start)]
    return command


def _profile(doc: dict) -> list[list[str]]:
    """The login profile's lines, each split as bash splits it (``printf '%s\\n' LINE...``)."""
    words = shlex.split(_setup_command(doc, "printf "))
    assert words[:2] == ["printf", "%s\\n"] and words[-2:] == [">", "~/.fusion-ray-profile"]
    return [shlex.split(line) for line in words[2:-2]]


def _storage_words(doc: dict, root: str) -> tuple[list[str], list[str]]:
    """Where the storage root is in the commands, and where it must be."""
    profile = [w for line in _profile(doc) for w in line if w.startswith("FUSION_RAY_STORAGE=")]
    start = shlex.split(doc["head_start_ray_commands"][1])
    found = [*profile, start[start.index("--artifacts-destination") + 1]]
    wanted = [f"FUSION_RAY_STORAGE={root}/ray_results", f"{root}/mlflow"]
    if not root.startswith("s3://"):  # the check that the shared folder is there
        check = shlex.split(_setup_command(doc, "test -d "))
        found += [check[2], check[6], check[10].split(" is not a writable folder")[0]]
        wanted += [root] * 3
    return found, wanted


def _python_env_words(doc: dict, env: str) -> tuple[list[str], list[str]]:
    """The environment's interpreter in the version check, and its bin on the profile's PATH."""
    check = _setup_command(doc, 'test "$(')
    inner = check[len('test "$(') : check.index(')" = ')]
    path = [w for line in _profile(doc) for w in line if w.startswith("PATH=")]
    return [shlex.split(inner)[0], *path], [f"{env}/bin/python", f"PATH={env}/bin:$PATH"]


@dataclass(frozen=True)
class LabField:
    """One input of ``fusion-ray cluster onprem``: its flag (as errors name it), the lab holding
    a value there, a benign value, and where the value must be in the file."""

    flag: str
    lab: Callable[[str], Lab]
    benign: str
    where: Callable[[dict, str], tuple[Any, Any]]


LAB_FIELDS = {
    "head": LabField(
        "--head", lambda v: _lab(head=v), "h1", lambda d, v: (d["provider"]["head_ip"], v)
    ),
    "workers": LabField(
        "--workers", lambda v: _lab(workers=("10.0.0.2", v)), "w3",
        lambda d, v: (d["provider"]["worker_ips"], ["10.0.0.2", v]),
    ),
    "user": LabField(
        "--user", lambda v: _lab(user=v), "u", lambda d, v: (d["auth"]["ssh_user"], v)
    ),
    "key": LabField(
        "--key", lambda v: _lab(key="~/.ssh/" + v), "id",
        lambda d, v: (d["auth"]["ssh_private_key"], "~/.ssh/" + v),
    ),
    "storage": LabField(
        "--storage", lambda v: _lab(storage="/mnt/" + v), "shared",
        lambda d, v: _storage_words(d, ("/mnt/" + v).rstrip("/")),
    ),
    "storage_s3": LabField(
        "--storage", lambda v: _lab(storage="s3://bucket/" + v), "prefix",
        lambda d, v: _storage_words(d, ("s3://bucket/" + v).rstrip("/")),
    ),
    "python_env": LabField(
        "--python-env", lambda v: _lab(python_env="/opt/" + v), "env",
        lambda d, v: _python_env_words(d, "/opt/" + v),
    ),
    "name": LabField("--name", lambda v: _lab(name=v), "lab", lambda d, v: (d["cluster_name"], v)),
    "ssh_proxy_command": LabField(
        "--ssh-proxy-command", lambda v: _lab(ssh_proxy_command=v), "nc %h 2222",
        lambda d, v: (d["auth"]["ssh_proxy_command"], v),
    ),
}  # fmt: skip

_LAB_COMMAND = re.compile(r"^#   (fusion-ray cluster onprem .*) > FILE\.yaml$", re.M)


def check_lab_file(text: str, lab: Lab, benign_shape: Any) -> dict:
    """Printable text; comment lines only down to ``cluster_name``; one YAML document of the
    benign render's shape; the header's command, as bash splits it, is the lab's and renders the
    same file again."""
    assert _printable_lines(text), "a control character or line separator in the cluster file"
    lines = text.split("\n")
    body = next(i for i, line in enumerate(lines) if not line.startswith("#"))
    assert lines[body] == "" and lines[body + 1].startswith("cluster_name:"), lines[: body + 2]
    docs = list(yaml.load_all(text, Loader=_LOADER))
    assert len(docs) == 1, f"{len(docs)} documents"
    (doc,) = docs
    assert _shape(doc, "") == benign_shape
    (command,) = _LAB_COMMAND.findall(text)
    words = shlex.split(command)
    assert words[:3] == ["fusion-ray", "cluster", "onprem"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cluster_main(words[2:]) == 0
    assert out.getvalue() == text, "the header's command renders another file"
    return doc


@pytest.mark.unit
@pytest.mark.parametrize("field", LAB_FIELDS)
def test_onprem_hostile_values_are_refused_or_serialised_where_they_belong(field):
    spec = LAB_FIELDS[field]
    benign_shape = _shape(yaml.safe_load(render_onprem(spec.lab(spec.benign))), "")
    rendered = 0
    for value in [spec.benign, *hostile(f"onprem {field}")]:
        lab = spec.lab(value)
        text = _refused_or_rendered(render_onprem, lab, spec.flag)
        if text is None:
            continue
        doc = check_lab_file(text, lab, benign_shape)
        found, wanted = spec.where(doc, value)
        assert found == wanted, (field, value[:60])
        rendered += 1
    assert rendered >= 1
    if field == "ssh_proxy_command":
        assert rendered > 40, "most values are legal here: the check must see them rendered"


#: A line of YAML of its own after a line break YAML knows: the file would run in this image.
_INJECTED = "docker: {image: evil, container_name: x} #"


@pytest.mark.unit
@pytest.mark.parametrize(
    ("field", "value"),
    [("ssh_proxy_command", f"nc %h 2222\r{_INJECTED}"),
     ("ssh_proxy_command", f"nc %h 2222\x85{_INJECTED}"),
     ("ssh_proxy_command", f"nc %h 2222\u2028{_INJECTED}"),
     ("ssh_proxy_command", f"nc %h 2222\u2029{_INJECTED}"),
     ("name", f"lab\r{_INJECTED}"), ("name", f"lab\n{_INJECTED}"),
     ("storage", f"x\r{_INJECTED}"), ("python_env", f"x\n{_INJECTED}"),
     ("key", f"id\u2028{_INJECTED}")],
)  # fmt: skip
def test_onprem_reproduction_a_line_break_adds_no_key(field, value):
    """A carriage return (or U+0085, U+2028, U+2029) in --ssh-proxy-command used to end the
    header's comment, which quotes the command that rendered the file: the rest was read as YAML
    (a ``docker:`` key made every node run in another image)."""
    spec = LAB_FIELDS[field]
    text = _refused_or_rendered(render_onprem, spec.lab(value), spec.flag)
    if text is not None:
        assert "docker" not in yaml.safe_load(text), "the value added a key"
        benign_shape = _shape(yaml.safe_load(render_onprem(spec.lab(spec.benign))), "")
        doc = check_lab_file(text, spec.lab(value), benign_shape)
        found, wanted = spec.where(doc, value)
        assert found == wanted


@pytest.mark.unit
@pytest.mark.parametrize("field", LAB_FIELDS)
def test_onprem_a_nul_or_a_lone_surrogate_is_refused_naming_the_flag(field):
    spec = LAB_FIELDS[field]
    for value in ("a\0b", "a\udcffb"):
        with pytest.raises(ValueError, match=re.escape(spec.flag)):
            render_onprem(spec.lab(value))


@pytest.mark.unit
@pytest.mark.parametrize("port", list(vars(Ports())))
def test_onprem_a_port_that_is_no_number_is_refused_naming_the_flag(port):
    """The ports are written as numbers; a string (or True) from code calling the renderer is
    refused, not written."""
    flag = f"--{port.replace('_', '-')}-port"
    for value in ("5000\rdocker: {image: evil} #", True, 5000.5):
        lab = _lab(ports=dataclasses.replace(Ports(), **{port: value}))
        with pytest.raises(ValueError, match=re.escape(flag)):
            render_onprem(lab)


@pytest.mark.unit
def test_onprem_a_value_starting_with_a_dash_is_one_word_of_the_header():
    """``--name --x`` would be read as two options: the header writes ``--name=--x``."""
    lab = _lab(name="--no-report", key="-k", ssh_proxy_command="-W")
    text = render_onprem(lab)
    shape = _shape(yaml.safe_load(render_onprem(_lab(ssh_proxy_command="nc %h 2222"))), "")
    doc = check_lab_file(text, lab, shape)
    assert (doc["cluster_name"], doc["auth"]["ssh_private_key"]) == ("--no-report", "-k")


@pytest.mark.process  # bash reads each value back
def test_a_value_in_double_quotes_is_read_back_by_bash_exactly(tmp_path):
    """What the cluster files write between double quotes (the storage root, the environment's
    path) is each value exactly, once bash has read it."""
    values = [v for v in hostile("double quotes") if "\0" not in v]
    script = "".join(f'printf "%s\\0" "{in_double_quotes(v)}"\n' for v in values)
    (tmp_path / "read.sh").write_bytes(script.encode("utf-8", "surrogateescape"))
    done = subprocess.run(
        ["bash", str(tmp_path / "read.sh")],
        env={"PATH": os.environ["PATH"], "LC_ALL": "C"},
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 0 and not done.stderr, done.stderr
    assert done.stdout.decode("utf-8", "surrogateescape").split("\0")[:-1] == values
