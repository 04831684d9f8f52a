"""A launch target brought by a plug-in: a plain bash script that makes a Ray cluster of a list
of SSH hosts and runs a sweep on it, for machines with no scheduler and no Ray cluster launcher:

    fusion-ray cluster ssh_hosts sweeps/quickstart.yaml train.epochs=3 \\
        --hosts gpu1,gpu2,gpu3 --workdir /srv/fusion-ray > run.sh
    bash run.sh        # where `ssh HOST` reaches every host without a password

The script starts the Ray head on the first host, a Ray worker on each other, runs the sweep
driver on the head, and stops Ray on every host when it ends. Every value reaches it as one
quoted bash word, and each command goes to a host with its words quoted again for the host's
shell (``printf %q``), so no value adds a word, a line or a command. ``fusion_ray.testing``'s
``check_launcher("ssh_hosts")`` is its contract test.
"""

from __future__ import annotations

import argparse
import re

from fusion_ray.launch import LaunchTarget
from fusion_ray.launch.shell import shell_join, shell_word, sweep_command_problems, text_problem

#: A host as ssh takes it: ``[USER@]HOST``, not starting with '-' (ssh would read an option).
_HOST = re.compile(r"(?:[A-Za-z_][A-Za-z0-9_.-]*@)?[A-Za-z0-9][A-Za-z0-9.-]*")

_BODY = r"""
set -uo pipefail
hosts=(@HOSTS@)
port=@PORT@
workdir=@WORKDIR@
activate=@ACTIVATE@
head=${hosts[0]}
address="${head#*@}:$port"
# One command on a host, its words quoted for the host's shell, in the checkout, after the
# activation line.
on_host() {
    local host=$1 command
    shift
    command=$(printf '%q ' "$@")
    [ -z "$workdir" ] || command="cd -- $(printf '%q' "$workdir") && $command"
    [ -z "$activate" ] || command="eval -- $(printf '%q' "$activate") && $command"
    ssh -o BatchMode=yes -- "$host" "$command"
}
stop_ray() {
    for host in "${hosts[@]}"; do on_host "$host" ray stop > /dev/null 2>&1; done
}
trap stop_ray EXIT
on_host "$head" ray start --head --port="$port" --disable-usage-stats || exit 1
for host in "${hosts[@]:1}"; do
    on_host "$host" ray start --address="$address" --disable-usage-stats || exit 1
done
on_host "$head" python -m fusion_ray.sweep @SWEEP@ --address "$address"
"""


class SshHosts(LaunchTarget):
    """A bash script: the Ray head on the first SSH host, a worker on each other, the sweep on
    the head; Ray stopped on every host at the end (run it with bash where ssh reaches them)."""

    summary = "print a bash script that runs a sweep on a Ray cluster of SSH hosts"
    code_options = ("--activate",)  # one shell line, run as written on each host

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--hosts",
            required=True,
            help="[USER@]HOST,... : the first runs the Ray head and the sweep driver",
        )
        parser.add_argument(
            "--workdir", default=None, help="the checkout on every host (default: the login folder)"
        )
        parser.add_argument(
            "--activate", default=None, help="one shell line activating the environment on a host"
        )
        parser.add_argument("--port", type=int, default=6379, help="the Ray head's port")

    def problems(self, args: argparse.Namespace) -> list[str]:
        """Every reason the script could not work, each naming its option."""
        texts = [("the sweep file", args.sweep_file), ("--hosts", args.hosts)]
        texts += [(f"override {i + 1}", o) for i, o in enumerate(args.overrides)]
        texts += [("--workdir", args.workdir), ("--activate", args.activate)]
        out = [p for what, v in texts if v is not None and (p := text_problem(what, v))]
        if out:
            return out
        out = sweep_command_problems(args.sweep_file, args.overrides)
        hosts = args.hosts.split(",")
        if not all(_HOST.fullmatch(host) for host in hosts):
            out.append(f"--hosts {args.hosts!r}: [USER@]HOST names, comma-separated")
        if args.activate is not None and not args.activate.isprintable():
            out.append(f"--activate {args.activate!r}: one line of shell (it runs as written)")
        if not 1024 <= args.port <= 65535:
            out.append(f"--port {args.port}: from 1024 to 65535")
        return out

    def render(self, args: argparse.Namespace) -> str:
        problems = self.problems(args)
        if problems:
            raise ValueError("cannot render the ssh_hosts script:\n  " + "\n  ".join(problems))
        argv = ["fusion-ray", "cluster", "ssh_hosts", args.sweep_file, *args.overrides]
        argv.append(f"--hosts={args.hosts}")
        values = {
            "@HOSTS@": shell_join(args.hosts.split(",")),
            "@PORT@": str(args.port),
            "@WORKDIR@": shell_word(args.workdir or ""),
            "@ACTIVATE@": shell_word(args.activate or ""),
            "@SWEEP@": shell_join([args.sweep_file, *args.overrides]),
        }
        for flag in ("workdir", "activate"):
            if getattr(args, flag) is not None:
                argv.append(f"--{flag}={getattr(args, flag)}")
        if args.port != 6379:
            argv.append(f"--port={args.port}")
        header = [
            "#!/bin/bash",
            "# fusion-ray: a sweep on a Ray cluster of SSH hosts. Rendered by",
            f"#   {shell_join(argv)}",
            "# Run it with bash where `ssh HOST` reaches every host without a password.",
        ]
        body = re.sub(r"@[A-Z]+@", lambda match: values[match.group(0)], _BODY)
        return "\n".join(header) + "\n" + body

    def example_args(self) -> list[str]:
        return ["--hosts", "gpu1,lab@gpu2", "--workdir", "/srv/fusion-ray"]
