"""The shell blocks of README.md, CONTRIBUTING.md and docs/ stay true to the code.

Every fenced `sh`, `bash`, `shell` or `console` block is checked, command by command, without
running it (most need a running stack or a cluster):

* `make <target> [VAR=value]`: the Makefile has the target, and uses the variable;
* the project's commands (`dractl`, `dra-nats-auth`, the agents, any `.venv/bin/<script>`,
  `python -m devcluster ...`): `--help` of that exact (sub)command exits 0, and every flag
  the block passes appears in that help;
* a path argument that names a file of the repository (`tests/unit/.../test_x.py`) exists.

A block whose commands need a Kubernetes cluster, kubectl or docker is marked with an HTML
comment on the line right above its fence: `<!-- cluster-only -->`. Its project commands are
still checked; its other commands are not. In an unmarked block, a command this test cannot
check is a failure that says to mark the block or to teach the test the command.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.unit.docs import pages

CLUSTER_ONLY = "cluster-only"
SHELL_INFOS = frozenset({"sh", "bash", "shell", "console"})
BIN = pages.REPO / ".venv" / "bin"
# The project's console scripts ([project.scripts] in pyproject.toml), bare or as .venv/bin/.
PROJECT_SCRIPTS = frozenset(
    {"dractl", "dra-nats-auth", "dra-discovery", "dra-allocation", "dra-health"}
)
# Shell builtins and plain tools whose use in a block says nothing about this project.
SHELL_WORDS = frozenset({"export", "source", ".", "cd", "kill", "echo", "cat", "grep", "base64"})
# Third-party CLIs that a block may use beside ours: not installed by `make venv`, so their
# own arguments are not checked here.
EXTERNAL_TOOLS = frozenset({"jq", "nats"})
# What makes a block cluster-only; a marked block must use at least one of them.
CLUSTER_TOOLS = frozenset({"kubectl", "docker", "helm", "kustomize", "crictl"})
SEPARATORS = frozenset({"|", "||", "&&", ";", "&"})
REDIRECTIONS = frozenset({">", ">>", "<", "2>", "2>>", "&>"})
HELP_TIMEOUT_S = 30


@dataclass(frozen=True, slots=True)
class Command:
    """One simple command of a block, as the shell would split it."""

    fence: pages.Fence
    argv: tuple[str, ...]

    @property
    def where(self) -> str:
        return f"{self.fence.where}: {shlex.join(self.argv)}"


def _shell_fences() -> list[pages.Fence]:
    files = [pages.REPO / "README.md", pages.REPO / "CONTRIBUTING.md"]
    files += sorted(pages.DOCS.rglob("*.md"))
    return [f for path in files for f in pages.fences(path) if f.info in SHELL_INFOS]


def _substitutions(line: str) -> tuple[str, list[str]]:
    """The line with each `$(...)` and `<(...)` replaced by a word, and their inner commands.
    Single-quoted text is skipped, so a `(` in a quoted pattern does not count."""
    out: list[str] = []
    inner: list[str] = []
    i = 0
    while i < len(line):
        if line.startswith(("$(", "<("), i):
            depth, j, quoted = 1, i + 2, False
            while j < len(line) and depth:
                ch = line[j]
                if ch == "'":
                    quoted = not quoted
                elif not quoted and ch == "(":
                    depth += 1
                elif not quoted and ch == ")":
                    depth -= 1
                j += 1
            inner.append(line[i + 2 : j - 1])
            out.append("SUBSTITUTED")
            i = j
            continue
        out.append(line[i])
        i += 1
    return "".join(out), inner


def _logical_lines(fence: pages.Fence) -> Iterator[str]:
    """The block's command lines: continuations joined, prompts stripped (console: only the
    `$ ` lines are commands, the rest is output)."""
    text = fence.body.replace("\\\n", " ")
    for raw in text.splitlines():
        line = raw.strip()
        if fence.info == "console":
            if not line.startswith("$ "):
                continue
            line = line[2:]
        if line and not line.startswith("#"):
            yield line


def _split(fence: pages.Fence, line: str) -> Iterator[Command]:
    line, inner = _substitutions(line)
    for nested in inner:
        yield from _split(fence, nested)
    argv: list[str] = []
    tokens = iter(shlex.split(line, comments=True))
    for token in tokens:
        if token in SEPARATORS:
            if argv:
                yield Command(fence, tuple(argv))
            argv = []
        elif token in REDIRECTIONS:
            next(tokens, None)  # the redirection's file
        elif not argv and re.fullmatch(r"[A-Za-z_]\w*=.*", token):
            continue  # VAR=value before a command: its environment
        else:
            argv.append(token)
    if argv:
        yield Command(fence, tuple(argv))


def _commands(fence: pages.Fence) -> list[Command]:
    return [cmd for line in _logical_lines(fence) for cmd in _split(fence, line)]


@functools.cache
def _makefile() -> str:
    return (pages.REPO / "Makefile").read_text(encoding="utf-8")


def _make_targets() -> set[str]:
    return set(re.findall(r"(?m)^([A-Za-z0-9_.-]+)\s*:(?!=)", _makefile()))


@dataclass(frozen=True, slots=True)
class Help:
    """The `--help` of one (sub)command: its exit status and its text."""

    returncode: int
    text: str

    def usage_names(self, words: tuple[str, ...]) -> bool:
        """True when the usage line ends its command part with `words` (a subcommand path)."""
        first = self.text.lstrip().splitlines()[0] if self.text.strip() else ""
        pattern = r"(?:^|\s)" + re.escape(" ".join(words)) + r"(?=\s+[\[{(<A-Z-]|\s*$)"
        return bool(words) and first.startswith("usage:") and bool(re.search(pattern, first))

    def has_flag(self, flag: str) -> bool:
        return re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", self.text) is not None

    def flag_takes_value(self, flag: str) -> bool:
        """`--flag VALUE`, `-o {text,json}`: argparse writes a metavar after the flag."""
        return (
            re.search(rf"(?<![\w-]){re.escape(flag)}[ =](?:[A-Z][A-Z0-9_]*|\{{)", self.text)
            is not None
        )


@functools.cache
def _help(argv: tuple[str, ...]) -> Help:
    """`argv --help`, from the repository root, with no settings of this machine's shell."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NATS_", "NODE_", "KUBE"))}
    env["COLUMNS"] = "200"  # one usage line per command, as wide as argparse wants
    try:
        done = subprocess.run(
            [*argv, "--help"],
            cwd=pages.REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=HELP_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return Help(returncode=-1, text=f"--help ran past {HELP_TIMEOUT_S} s")
    return Help(returncode=done.returncode, text=done.stdout + done.stderr)


def _project_base(argv: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """(how to run the program here, its arguments), for a command of this project."""
    program = argv[0]
    if program in PROJECT_SCRIPTS:
        return (str(BIN / program),), argv[1:]
    if program.startswith(".venv/bin/"):
        name = program.removeprefix(".venv/bin/")
        if name.startswith("python") and argv[1:2] == ("-m",) and len(argv) > 2:
            return (sys.executable, "-m", argv[2]), argv[3:]
        return (str(pages.REPO / program),), argv[1:]
    if program in {"python", "python3"} and argv[1:2] == ("-m",) and len(argv) > 2:
        return (sys.executable, "-m", argv[2]), argv[3:]
    return None


def _shown(argv: tuple[str, ...]) -> str:
    """A command as the docs write it: `.venv/bin/dractl`, `python -m devcluster`."""
    words = ["python" if w == sys.executable else w for w in argv]
    return shlex.join(w.removeprefix(f"{pages.REPO}/") for w in words)


def _check_project_command(base: tuple[str, ...], args: tuple[str, ...]) -> list[str]:
    """Walks the arguments as argparse would: words that `--help` confirms as subcommands
    descend, flags must be in the current (sub)command's help, the rest are positionals."""
    problems: list[str] = []
    path: tuple[str, ...] = ()
    current = _help(base)
    if current.returncode != 0:
        return [f"`{_shown(base)} --help` exits {current.returncode}: {current.text[-300:]}"]
    descending = True
    i = 0
    while i < len(args):
        token = args[i]
        i += 1
        if token == "--":
            break
        if token.startswith("-") and token != "-":
            flag = token.split("=", 1)[0]
            if not current.has_flag(flag):
                problems.append(f"`{flag}` is not in `{_shown((*base, *path))} --help`")
            elif "=" not in token and current.flag_takes_value(flag):
                i += 1  # its value
            continue
        if descending and re.fullmatch(r"[a-z][a-z0-9-]*", token):
            candidate = _help((*base, *path, token))
            if candidate.returncode != 0:  # argparse: "invalid choice" of a subcommand
                shown = _shown((*base, *path, token))
                return [*problems, f"`{shown} --help` exits {candidate.returncode}"]
            if candidate.usage_names((*path, token)):
                path, current = (*path, token), candidate
                continue
        descending = False
        looks_like_file = "/" in token and re.search(r"\.(py|md|ya?ml|json)$", token)
        if looks_like_file and not (pages.REPO / token).exists():
            problems.append(f"`{token}` is no file of the repository")
    return problems


def _check_make(args: tuple[str, ...]) -> list[str]:
    problems: list[str] = []
    targets = _make_targets()
    for token in args:
        if "=" in token:
            variable = token.split("=", 1)[0]
            if f"$({variable})" not in _makefile():
                problems.append(f"the Makefile does not use `{variable}`")
        elif token.startswith("-"):
            problems.append(f"`make {token}`: flags to make are not checked; drop it")
        elif token not in targets:
            problems.append(f"the Makefile has no target `{token}`")
    return problems


def _check(command: Command, *, cluster_only: bool) -> list[str]:
    program, args = command.argv[0], command.argv[1:]
    if program == "make":
        return _check_make(args)
    project = _project_base(command.argv)
    if project is not None:
        return _check_project_command(*project)
    if program in {"source", "."}:
        target = args[0] if args else ""
        missing = "/" in target and not (pages.REPO / target).exists()
        return [f"`{target}` does not exist"] if missing else []
    if program in SHELL_WORDS or program in EXTERNAL_TOOLS or cluster_only:
        return []
    return [
        f"`{program}` cannot be checked here: mark the block `<!-- {CLUSTER_ONLY} -->` if it "
        "needs a cluster, or teach tests/unit/docs/test_command_blocks.py the command"
    ]


FENCES = _shell_fences()


def test_there_are_blocks_to_check() -> None:
    assert len(FENCES) > 15
    assert sum(1 for f in FENCES if CLUSTER_ONLY not in f.markers) > 8


@pytest.mark.parametrize("fence", FENCES, ids=[f.where for f in FENCES])
def test_every_command_of_a_block_is_valid(fence: pages.Fence) -> None:
    cluster_only = CLUSTER_ONLY in fence.markers
    commands = _commands(fence)
    assert commands, "a shell block with no command"
    problems = [
        f"{cmd.where}\n    {problem}"
        for cmd in commands
        for problem in _check(cmd, cluster_only=cluster_only)
    ]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    "fence",
    [f for f in FENCES if CLUSTER_ONLY in f.markers],
    ids=[f.where for f in FENCES if CLUSTER_ONLY in f.markers],
)
def test_a_cluster_only_block_needs_a_cluster(fence: pages.Fence) -> None:
    # The marker is no way around the checks: the block must use a cluster's tool.
    programs = {cmd.argv[0] for cmd in _commands(fence)}
    assert programs & CLUSTER_TOOLS, f"marked {CLUSTER_ONLY} but uses none of {CLUSTER_TOOLS}"


def test_the_checks_catch_what_drifted() -> None:
    fence = pages.Fence(
        path=pages.REPO / "README.md", line=1, info="sh", body="", markers=frozenset()
    )

    def problems(line: str) -> list[str]:
        return [p for cmd in _split(fence, line) for p in _check(cmd, cluster_only=False)]

    assert problems("make demo") == []
    assert problems("make nosuchtarget") == ["the Makefile has no target `nosuchtarget`"]
    assert problems("make up NOSUCHVAR=1") == ["the Makefile does not use `NOSUCHVAR`"]
    assert problems(".venv/bin/python -m devcluster claim --count 2") == []
    assert problems("python -m devcluster claim --no-such-flag") == [
        "`--no-such-flag` is not in `python -m devcluster claim --help`"
    ]
    assert problems("dra-nats-auth revoke-node node-a --until 12h | jq .") == []
    assert problems("python -m devcluster nosuch") == [
        "`python -m devcluster nosuch --help` exits 2"
    ]
    assert problems("kubectl get pods")[0].startswith("`kubectl` cannot be checked here")
    assert problems("source .venv/bin/activate") == []


def test_a_block_splits_into_commands_as_the_shell_would() -> None:
    fence = pages.Fence(
        path=pages.REPO / "README.md",
        line=1,
        info="sh",
        body=(
            "export A=1 B=2   # comment\n"
            "X=1 dractl inventory -o json | jq '.[].name' > out.json\n"
            "kubectl create cm x \\\n"
            "  --from-literal=k=\"$(dra-nats-auth keygen | grep -E '^(a|b)')\"\n"
            "source <(dractl completion bash)   # or zsh\n"
        ),
        markers=frozenset(),
    )
    assert [cmd.argv for cmd in _commands(fence)] == [
        ("export", "A=1", "B=2"),
        ("dractl", "inventory", "-o", "json"),
        ("jq", ".[].name"),
        ("dra-nats-auth", "keygen"),
        ("grep", "-E", "^(a|b)"),
        ("kubectl", "create", "cm", "x", "--from-literal=k=SUBSTITUTED"),
        ("dractl", "completion", "bash"),
        ("source", "SUBSTITUTED"),
    ]
