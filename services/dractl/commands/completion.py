"""`dractl completion bash|zsh`: a shell completion script generated from dractl's own parser.

It completes subcommands, their flags, the global flags and the values of `-o`, so it never
drifts from the parser. zsh loads the bash function through bashcompinit (kubectl's way).
"""

from __future__ import annotations

import argparse
from typing import TextIO

from services.dractl.output import FORMATS
from services.dractl.subcommands import Subcommands

__all__ = ["NAME", "SHELLS", "register", "run", "script"]

NAME = "completion"
SHELLS = ("bash", "zsh")

_BASH = """# dractl completion for bash; load it with: source <(dractl completion bash)
_dractl() {{
    local cur prev command word
    cur="${{COMP_WORDS[COMP_CWORD]}}"
    prev="${{COMP_WORDS[COMP_CWORD-1]}}"
    command=""
    for word in "${{COMP_WORDS[@]:1:COMP_CWORD-1}}"; do
        case "$word" in
            {commands_pattern}) command="$word"; break ;;
        esac
    done
    case "$prev" in
        -o|--output) COMPREPLY=($(compgen -W "{outputs}" -- "$cur")); return ;;
    esac
    case "$command" in
{per_command}
        "") COMPREPLY=($(compgen -W "{commands} {global_flags}" -- "$cur")) ;;
    esac
}}
complete -F _dractl dractl
"""

_ZSH_PREAMBLE = """# dractl completion for zsh; load it with: source <(dractl completion zsh)
autoload -U +X bashcompinit && bashcompinit
"""


def register(subcommands: Subcommands) -> None:
    parser = subcommands.add(
        NAME, summary="a shell completion script", description=None, global_flags=False
    )
    parser.add_argument("shell", choices=SHELLS)
    parser.set_defaults(completed=subcommands.dractl)


async def run(args: argparse.Namespace, *, out: TextIO, err: TextIO) -> int:
    out.write(script(args.completed, shell=args.shell, outputs=FORMATS))
    return 0


def _flags(parser: argparse.ArgumentParser) -> list[str]:
    return sorted(
        option
        for action in parser._actions  # argparse has no public way to list its options
        for option in action.option_strings
        if option.startswith("--") and action.help != argparse.SUPPRESS
    )


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def script(parser: argparse.ArgumentParser, *, shell: str, outputs: tuple[str, ...]) -> str:
    commands = _subcommands(parser)
    global_flags = _flags(parser)
    per_command = "\n".join(
        f'        {name}) COMPREPLY=($(compgen -W "{" ".join(_choices(sub) + _flags(sub))}"'
        ' -- "$cur")) ;;'
        for name, sub in commands.items()
    )
    bash = _BASH.format(
        commands_pattern="|".join(commands),
        commands=" ".join(commands),
        global_flags=" ".join(global_flags),
        outputs=" ".join(outputs),
        per_command=per_command,
    )
    return bash if shell == "bash" else _ZSH_PREAMBLE + bash


def _choices(parser: argparse.ArgumentParser) -> list[str]:
    """Fixed positional words (`fault inject|clear`, `completion bash|zsh`)."""
    return [
        str(choice)
        for action in parser._actions
        if not action.option_strings and action.choices and not isinstance(action.choices, dict)
        for choice in action.choices
    ]
