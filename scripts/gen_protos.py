"""Generate Python code, gRPC stubs and mypy stubs from protos/ into shared/pb/.

Usage::

    .venv/bin/python scripts/gen_protos.py [--out DIR]

Every ``.proto`` file under ``protos/`` is compiled with ``grpc_tools.protoc``
and ``-I protos``, so each descriptor is named by its path relative to
``protos/`` (``kubelet/dra/v1/api.proto``); that keeps the five upstream
``api.proto`` files apart in one descriptor pool. Output per proto:
``*_pb2.py``, ``*_pb2_grpc.py`` and their ``.pyi`` stubs (mypy-protobuf).

protoc writes absolute imports rooted at ``protos/`` (``from kubelet.dra.v1
import api_pb2``); they are rewritten to ``shared.pb.…``, as is the module
name the messages get as ``__module__``. Every generated package gets an
``__init__.py``. The result is deterministic, so a regenerated tree can be
compared byte for byte with the committed one (tests/unit/shared/test_protos.py).

``--out`` only changes where the files go: imports always say ``shared.pb``.
The generated ``.py``/``.pyi`` files already in the output directory are
removed first; the directory itself is kept.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = REPO_ROOT / "protos"
DEFAULT_OUT = REPO_ROOT / "shared" / "pb"
IMPORT_PREFIX = "shared.pb"
GENERATED_SUFFIXES = frozenset({".py", ".pyi"})
ROOT_INIT = '"""Generated from protos/ by scripts/gen_protos.py; never edit by hand."""\n'


class GenerateError(RuntimeError):
    """Generation failed; the message says why."""


def find_protos(proto_root: Path = PROTO_ROOT) -> list[Path]:
    """Every .proto under proto_root, as sorted paths relative to it."""
    return sorted(p.relative_to(proto_root) for p in proto_root.rglob("*.proto"))


def _plugin(name: str) -> Path:
    # The venv's bin dir, next to the interpreter; not resolved, since the
    # interpreter is usually a symlink out of the venv.
    path = Path(sys.executable).parent / name
    if not path.is_file():
        raise GenerateError(f"{name} not found at {path}; install mypy-protobuf into this venv")
    return path


def _run_protoc(protos: Sequence[Path], out: Path) -> None:
    args = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"--plugin=protoc-gen-mypy={_plugin('protoc-gen-mypy')}",
        f"--plugin=protoc-gen-mypy_grpc={_plugin('protoc-gen-mypy_grpc')}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        f"--mypy_out=quiet:{out}",
        f"--mypy_grpc_out=quiet:{out}",
        *(str(PROTO_ROOT / p) for p in protos),
    ]
    result = subprocess.run(args, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise GenerateError(f"protoc failed ({result.returncode}):\n{result.stderr}")


def rewrite_imports(text: str, top_packages: Sequence[str]) -> str:
    """Point imports of generated modules at shared.pb.<top>.…; fail on a form we can't move."""
    tops = "|".join(re.escape(t) for t in sorted(top_packages))
    patterns = [
        # from kubelet.dra.v1 import api_pb2 as x  ->  from shared.pb.kubelet.dra.v1 import ...
        re.compile(rf"^(\s*from\s+)((?:{tops})(?:\.\w+)*)(\s+import\s)", re.M),
        # import kubelet.dra.v1.api_pb2 as x  ->  import shared.pb.kubelet.dra.v1.api_pb2 as x
        re.compile(rf"^(\s*import\s+)((?:{tops})(?:\.\w+)+)(\s+as\s)", re.M),
        # The messages' __module__:
        # BuildTopDescriptorsAndMessages(DESCRIPTOR, 'kubelet.dra.v1.api_pb2', _globals)
        re.compile(rf"(Build\w+\(DESCRIPTOR, ')((?:{tops})(?:\.\w+)+)(')"),
    ]
    for pattern in patterns:
        text = pattern.sub(lambda m: f"{m[1]}{IMPORT_PREFIX}.{m[2]}{m[3]}", text)
    bare = re.search(rf"^\s*import\s+(?:{tops})\.[\w.]+\s*$", text, re.M)
    if bare:
        # `import a.b.c` is used as `a.b.c.X` further down; moving it would need
        # the uses rewritten too. mypy-protobuf 5 and protoc don't emit it.
        raise GenerateError(f"cannot rewrite unaliased import: {bare[0].strip()!r}")
    return text


def _postprocess(tree: Path, top_packages: Sequence[str]) -> None:
    for path in sorted(tree.rglob("*")):
        if path.is_file() and path.suffix in GENERATED_SUFFIXES:
            text = path.read_text(encoding="utf-8")
            new = rewrite_imports(text, top_packages)
            if new != text:
                path.write_text(new, encoding="utf-8", newline="\n")
    # Every dir holding generated modules, and each of its parents up to tree,
    # is a package. Sub-package __init__.py files are empty.
    packages = {tree}
    for module in tree.rglob("*.py"):
        packages.update(_parents(module.parent, tree))
    for pkg in sorted(packages):
        init = pkg / "__init__.py"
        init.write_text(ROOT_INIT if pkg == tree else "", encoding="utf-8", newline="\n")


def _parents(path: Path, stop: Path) -> set[Path]:
    found = set()
    while path != stop:
        found.add(path)
        path = path.parent
    return found


def _wipe(out: Path) -> None:
    """Remove generated files from out (and caches, and dirs left empty); keep out."""
    if not out.exists():
        return
    for path in sorted(out.rglob("__pycache__"), reverse=True):
        shutil.rmtree(path)
    for path in sorted(out.rglob("*")):
        if path.is_file() and path.suffix in GENERATED_SUFFIXES:
            path.unlink()
    for path in sorted((p for p in out.rglob("*") if p.is_dir()), reverse=True):
        if not any(path.iterdir()):
            path.rmdir()


def generate(out: Path = DEFAULT_OUT) -> list[Path]:
    """Regenerate everything into out; return the written files relative to out."""
    protos = find_protos()
    if not protos:
        raise GenerateError(f"no .proto files under {PROTO_ROOT}")
    top_packages = sorted({p.parts[0] for p in protos})
    with tempfile.TemporaryDirectory(prefix="gen_protos-") as tmp:
        tree = Path(tmp)
        _run_protoc(protos, tree)
        _postprocess(tree, top_packages)
        written = sorted(p.relative_to(tree) for p in tree.rglob("*") if p.is_file())
        _wipe(out)
        out.mkdir(parents=True, exist_ok=True)
        for rel in written:
            dest = out / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes((tree / rel).read_bytes())
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help="output directory (default: shared/pb); imports still say shared.pb",
    )
    args = parser.parse_args(argv)
    try:
        written = generate(args.out.resolve())
    except GenerateError as exc:
        print(f"gen_protos: {exc}", file=sys.stderr)
        return 1
    print(f"gen_protos: wrote {len(written)} files to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
