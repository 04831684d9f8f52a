"""``fusion-ray completion bash|zsh``: the shell completion of ``fusion-ray``, generated from the
commands' own parsers (every command, its options, the launch targets, file names elsewhere).

    eval "$(fusion-ray completion bash)"    # in ~/.bashrc
    eval "$(fusion-ray completion zsh)"     # in ~/.zshrc (zsh's bashcompinit runs the same)
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence

from fusion_ray.cli import COMMANDS

FUNCTION = "_fusion_ray_complete"


def command_options() -> dict[str, list[str]]:
    """Each command's options, from the parser it runs (``cluster``: its targets)."""
    # lazy: the commands' modules (the report's is ~1 s); only this command needs them
    from analysis.report import build_parser as report_parser
    from fusion_ray.hpo.cli import build_parser as hpo_parser
    from fusion_ray.launch import LAUNCHERS
    from fusion_ray.planner import build_parser as plan_parser
    from fusion_ray.sweep import build_parser as sweep_parser
    from fusion_ray.train.__main__ import build_parser as train_parser

    parsers = {
        "sweep": sweep_parser(),
        "plan": plan_parser(),
        "hpo": hpo_parser(),
        "report": report_parser(),
        "train": train_parser(),
    }
    out = {
        name: sorted(o for a in parser._actions for o in a.option_strings)
        for name, parser in parsers.items()
    }
    out["cluster"] = [*LAUNCHERS.names(), "--help"]
    out["list"] = ["--help"]
    out["completion"] = ["bash", "zsh", "--help"]
    assert set(out) == set(COMMANDS), "a command without completion"
    return out


def bash_script() -> str:
    """A bash completion function for ``fusion-ray``: commands first, then the command's
    options (after a ``-``), its targets (``cluster``) or file names."""
    cases = "\n".join(
        f"        {name}) opts={shlex.quote(' '.join(options))} ;;"
        for name, options in command_options().items()
    )
    commands = " ".join([*COMMANDS, "--help", "--version"])
    return f"""{FUNCTION}() {{
    local cur=${{COMP_WORDS[COMP_CWORD]}} opts=""
    if [ "$COMP_CWORD" -eq 1 ]; then
        COMPREPLY=($(compgen -W {shlex.quote(commands)} -- "$cur"))
        return
    fi
    case "${{COMP_WORDS[1]}}" in
{cases}
    esac
    if [[ "$cur" == -* ]] || {{ [ "${{COMP_WORDS[1]}}" = cluster ] && [ "$COMP_CWORD" -eq 2 ]; }} ||
        {{ [ "${{COMP_WORDS[1]}}" = completion ] && [ "$COMP_CWORD" -eq 2 ]; }}; then
        COMPREPLY=($(compgen -W "$opts" -- "$cur"))
    else
        COMPREPLY=($(compgen -f -- "$cur"))
    fi
}}
complete -o filenames -F {FUNCTION} fusion-ray
"""


def zsh_script() -> str:
    """The bash function, through zsh's own bash-completion layer (``bashcompinit``)."""
    return "autoload -U +X compinit && compinit\nautoload -U +X bashcompinit && bashcompinit\n" + (
        bash_script()
    )


def main(argv: Sequence[str] | None = None, prog: str = "fusion-ray completion") -> int:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Print the shell completion of fusion-ray: "
        'eval "$(fusion-ray completion bash)" in ~/.bashrc, or zsh in ~/.zshrc.',
    )
    parser.add_argument("shell", choices=["bash", "zsh"], help="the shell to complete in")
    args = parser.parse_args(argv)
    print(bash_script() if args.shell == "bash" else zsh_script(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
