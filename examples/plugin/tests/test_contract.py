"""The example plug-in's own tests: each of its entries goes through fusion-ray's registry
contract suite, by the name a sweep file would use (so through the entry points, as a sweep
loads it), and its launch target's script is run with stand-ins for ssh, ray and python. Run
them with the package installed:

    pip install -e examples/plugin
    python -m pytest examples/plugin/tests
"""

from __future__ import annotations

import os
import subprocess

from fusion_ray.launch import render
from fusion_ray.testing import check_decision_rule, check_fusion, check_launcher, check_source


def test_position_gate_keeps_the_fusion_contract():
    check_fusion("position_gate")


def test_position_gate_keeps_it_with_its_option():
    check_fusion("position_gate", {"init_bias": 2.0})


def test_keywords_keeps_the_data_source_contract(tmp_path):
    options = {"num_classes": 3, "n_train": 60, "n_test": 20, "words": 8}
    check_source("keywords", options, {"max_length": 16}, cache_dir=str(tmp_path))


def test_sign_closure_keeps_the_decision_rule_contract():
    check_decision_rule("sign_closure")


def test_ssh_hosts_keeps_the_launch_target_contract():
    check_launcher("ssh_hosts")


STAND_INS = {
    # ssh -o BatchMode=yes -- HOST COMMAND: runs COMMAND with bash, as the host's shell would
    "ssh": 'HOST=$4 exec bash -c "$5"',
    "ray": 'printf "%s\\0" "$HOST" "$@" > "$RECORD/ray.$(date +%s%N)"',
    "python": 'printf "%s\\0" "$HOST" "$PWD" "$@" > "$RECORD/python"',
}


def _words(path) -> list[str]:
    return path.read_text().split("\0")[:-1]


def test_ssh_hosts_starts_ray_on_every_host_and_the_sweep_on_the_first(tmp_path):
    bin_dir, record, workdir = tmp_path / "bin", tmp_path / "record", tmp_path / "work dir"
    for folder in (bin_dir, record, workdir):
        folder.mkdir()
    for name, body in STAND_INS.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    sweep, overrides = "sweeps/it's a $(test).yaml", ['train.note=`x` "y"', "seeds=[0,1]"]
    script = render(
        "ssh_hosts", [sweep, *overrides, "--hosts", "gpu1,lab@gpu2", f"--workdir={workdir}"]
    )
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "RECORD": str(record)}
    done = subprocess.run(["bash"], input=script, text=True, env=env, capture_output=True)
    assert done.returncode == 0, done.stderr
    python = _words(record / "python")
    expected = ["gpu1", str(workdir), "-m", "fusion_ray.sweep", sweep, *overrides]
    assert python == [*expected, "--address", "gpu1:6379"]
    calls = sorted(_words(path) for path in record.glob("ray.*"))
    assert calls == sorted(
        [
            ["gpu1", "start", "--head", "--port=6379", "--disable-usage-stats"],
            ["lab@gpu2", "start", "--address=gpu1:6379", "--disable-usage-stats"],
            ["gpu1", "stop"],
            ["lab@gpu2", "stop"],
        ]
    )
