"""Every registered launch target (built-ins and installed plug-ins) keeps the contract of
``fusion_ray.testing.launch``: declared and documented options, a well-formed file with default
and hostile values, and a sweep command whose words are exactly the sweep file and its edits.
The contract catches a target that breaks it; ``fusion-ray cluster`` dispatches through the
registry."""

from __future__ import annotations

import argparse

import pytest

from fusion_ray.cli import list_entries
from fusion_ray.launch import LAUNCHERS, LaunchTarget, main
from fusion_ray.testing.launch import check_launcher


@pytest.mark.process  # bash -n and bash reading the sweep command's words
@pytest.mark.parametrize("name", LAUNCHERS.names())
def test_every_registered_launch_target_keeps_the_contract(name):
    check_launcher(name)


class _Unquoted(LaunchTarget):
    """Pastes the sweep file into its script as it is: a file with a space becomes two words."""

    summary = "a script that forgets to quote"

    def render(self, args: argparse.Namespace) -> str:
        words = " ".join([args.sweep_file, *args.overrides])
        return f"#!/bin/bash\npython -m fusion_ray.sweep {words}\n"


@pytest.mark.process
def test_the_contract_catches_a_target_that_does_not_quote_the_sweep_command():
    LAUNCHERS.register("unquoted", origin="tests")(_Unquoted)
    try:
        with pytest.raises(AssertionError, match="'unquoted' .*the sweep command gives"):
            check_launcher("unquoted")
    finally:
        LAUNCHERS.unregister("unquoted")


@pytest.mark.unit
def test_a_plugin_entry_that_is_no_launch_target_is_refused_saying_what_it_must_be():
    with pytest.raises(TypeError, match="must name a subclass of fusion_ray.launch.LaunchTarget"):
        LAUNCHERS.accept(print, "some-package")


@pytest.mark.unit
def test_the_cluster_command_lists_every_target_and_suggests_a_close_name(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for name in LAUNCHERS.names():
        assert f"    {name} " in out, name
    assert main(["slrum", "x.yaml"]) == 2
    assert "did you mean 'slurm'?" in capsys.readouterr().err


@pytest.mark.unit
def test_fusion_ray_list_shows_each_target_with_its_origin_and_options():
    text = list_entries()
    assert "launch targets (entry-point group fusion_ray.launchers" in text
    for name in LAUNCHERS.names():
        assert f"  {name:<20} [{LAUNCHERS.origin(name)}]  {LAUNCHERS.get(name).summary}" in text
    assert "--requeue-on-time-limit" in text and "--ssh-proxy-command" in text
