"""Podman as a real CDI runtime for the tests (issues 24 and 27).

A container started with a claim's CDI device names gets what the agent's CDI spec says: its
env, its device nodes and its mounts (the device metadata file). Podman reads CDI specs only
from `/etc/cdi` and `/var/run/cdi` (4.3.1 does not honour `cdi_spec_dirs`), so `published`
links the agent's spec file there under a unique name: the runtime reads the agent's own file
and, once an unprepare removed it, resolves nothing.

Needs root, podman, runc and a statically linked busybox (`scripts/ci/install-podman.sh`).
Without them a test skips with one line saying what is missing, or fails when `CI=true`. The
image (busybox alone, imported without a registry) is made once per machine and reused; the
containers.conf (runc, cgroupfs, no default ulimits: crun and the default nofile/nproc ulimits
fail on a cgroup v1 hybrid machine) is a temporary file of the session.

Podman 4.3.1 (Debian 12) resolves specs of `cdiVersion` up to 0.5.0; a 0.6.0 spec is
"unresolvable". The agent writes the minimum its fields need (0.5.0 at most so far).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import tarfile
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

__all__ = [
    "CDI_DIR",
    "IMAGE",
    "INSTALL_HINT",
    "ContainerView",
    "Podman",
    "RunResult",
    "SpecEdits",
    "json_objects",
    "podman_runtime",
    "published",
    "read_spec",
    "spec_edits",
]

CDI_DIR = Path("/var/run/cdi")
IMAGE = "localhost/dra-suite-cdi-busybox:1"
INSTALL_HINT = "scripts/ci/install-podman.sh installs podman, runc and busybox-static"
CONTAINERS_CONF = """\
[containers]
default_ulimits = []

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
"""
_APPLETS = ("sh", "cat", "ls", "env", "test", "stat", "true", "printf")
_LINK_PREFIX = "dra-suite-test-"
_IMAGE_LOCK = Path("/tmp/dra-suite-podman-image.lock")
_MARK = "@@dra-suite-podman@@"
_PT_INTERP = 3

_session: Podman | None = None


@dataclass(frozen=True, slots=True)
class RunResult:
    returncode: int
    stdout: str
    stderr: str


@dataclass(frozen=True, slots=True)
class ContainerView:
    """What a container with the devices saw: its env, the nodes and the files asked for."""

    env: dict[str, str]
    nodes: dict[str, tuple[int, int] | None]
    """Container path -> (major, minor) of the character device there, or None."""
    files: dict[str, str | None]
    """Container path -> its content, or None where it could not be read."""


@dataclass(frozen=True, slots=True)
class Podman:
    binary: str
    conf: Path
    image: str = IMAGE

    def _env(self) -> dict[str, str]:
        return {**os.environ, "CONTAINERS_CONF": str(self.conf)}

    async def run(
        self, devices: Sequence[str], script: str, *, timeout_s: float = 60.0
    ) -> RunResult:
        """`podman run --rm --device <id>... <image> /bin/sh -c <script>`, no network."""
        argv = [self.binary, "run", "--rm", "--pull=never", "--network=none"]
        argv += [f"--device={device}" for device in devices]
        argv += [self.image, "/bin/sh", "-c", script]
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self._env(),
        )
        try:
            out, err = await asyncio.wait_for(process.communicate(), timeout_s)
        except TimeoutError:
            process.kill()
            await process.wait()
            raise AssertionError(f"podman run did not end in {timeout_s} s: {argv}") from None
        assert process.returncode is not None
        return RunResult(
            process.returncode, out.decode(errors="replace"), err.decode(errors="replace")
        )

    async def look(
        self, devices: Sequence[str], *, nodes: Sequence[str] = (), files: Sequence[str] = ()
    ) -> ContainerView:
        """Start a container with `devices` and read its env, `nodes` and `files`; a container
        that does not start (an unresolvable device, say) fails the test with podman's error."""
        lines = [f"echo {_MARK} env", "env"]
        for path in nodes:
            quoted = shlex.quote(path)
            lines += [
                f"echo {_MARK} node {quoted}",
                f"if [ -c {quoted} ]; then stat -L -c '%t %T' {quoted}; fi",
            ]
        for path in files:
            quoted = shlex.quote(path)
            lines += [f"echo {_MARK} file {quoted}", f"cat {quoted} && printf '\\n{_MARK} ok\\n'"]
        lines.append("true")  # a file that cannot be read is a None, not a failed run
        result = await self.run(devices, "\n".join(lines))
        assert result.returncode == 0, f"podman run failed ({result.returncode}): {result.stderr}"
        return _parse_view(result.stdout)

    async def assert_unresolvable(self, devices: Sequence[str]) -> None:
        """Podman refuses to start a container with `devices`: no spec it reads names them."""
        result = await self.run(devices, "true")
        assert result.returncode != 0, f"podman still resolves {devices}"
        assert "unresolvable CDI devices" in result.stderr, result.stderr


def _parse_view(stdout: str) -> ContainerView:
    env: dict[str, str] = {}
    nodes: dict[str, tuple[int, int] | None] = {}
    files: dict[str, str | None] = {}
    sections = [s.partition("\n") for s in stdout.split(f"{_MARK} ")[1:]]
    for at, (head, _, body) in enumerate(sections):
        what, _, path = head.partition(" ")
        if what == "env":
            for line in body.splitlines():
                key, sep, value = line.partition("=")
                if sep:
                    env[key] = value
        elif what == "node":
            numbers = body.split()
            nodes[path] = (int(numbers[0], 16), int(numbers[1], 16)) if numbers else None
        elif what == "file":
            read = at + 1 < len(sections) and sections[at + 1][0] == "ok"
            files[path] = body.removesuffix("\n") if read else None  # printf's newline
    return ContainerView(env=env, nodes=nodes, files=files)


@dataclass(frozen=True, slots=True)
class SpecEdits:
    """The container edits a runtime applies for some devices of one spec: spec-level edits
    once, then each device's, in order (CDI `InjectDevices`)."""

    env: dict[str, str] = field(default_factory=dict)
    nodes: dict[str, str] = field(default_factory=dict)
    """Container path -> host path."""
    mounts: list[Mapping[str, Any]] = field(default_factory=list)

    def mounted_files(self) -> dict[str, str]:
        """Container path -> the host file's content, for every mount."""
        return {m["containerPath"]: Path(m["hostPath"]).read_text() for m in self.mounts}


def read_spec(path: Path) -> dict[str, Any]:
    spec: dict[str, Any] = json.loads(path.read_text())
    return spec


def spec_edits(spec: Mapping[str, Any], device_ids: Sequence[str]) -> SpecEdits:
    """What `spec` says a container with `device_ids` (`vendor/class=name`) gets. A variable
    set twice to different values fails the test: which one a process sees is then undefined."""
    by_name = {device["name"]: device for device in spec["devices"]}
    chosen: list[Mapping[str, Any]] = [spec.get("containerEdits") or {}]
    for device_id in device_ids:
        kind, _, name = device_id.partition("=")
        assert kind == spec["kind"], f"{device_id} is not of the spec's kind {spec['kind']}"
        assert name in by_name, f"{device_id} is not in the spec"
        chosen.append(by_name[name].get("containerEdits") or {})
    edits = SpecEdits()
    for edit in chosen:
        for pair in edit.get("env", ()):
            key, _, value = pair.partition("=")
            assert edits.env.setdefault(key, value) == value, f"{key} set twice: {spec}"
        for node in edit.get("deviceNodes", ()):
            edits.nodes[node["path"]] = node.get("hostPath") or node["path"]
        edits.mounts.extend(edit.get("mounts", ()))
    return edits


def json_objects(text: str) -> list[Any]:
    """The objects of a JSON stream (the device metadata file: one document per version)."""
    decoder, objects, at = json.JSONDecoder(), [], 0
    while text[at:].strip():
        at += len(text[at:]) - len(text[at:].lstrip())
        obj, at = decoder.raw_decode(text, at)
        objects.append(obj)
    return objects


@contextlib.contextmanager
def published(spec: Path) -> Iterator[Path]:
    """`spec` (which need not exist yet) visible to podman: a symlink to it in /var/run/cdi
    under a unique name, removed afterwards. A link rather than a copy, so that the runtime
    reads the agent's file as it is, and nothing once the agent removed it (a dangling link
    only logs a refresh error at debug level)."""
    CDI_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
    link = CDI_DIR / f"{_LINK_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}.json"
    link.symlink_to(spec)
    try:
        yield link
    finally:
        link.unlink(missing_ok=True)


def podman_runtime(tmp_path_factory: pytest.TempPathFactory) -> Podman:
    """The session's podman, its image made (once per machine); else skip or, with `CI=true`,
    fail. For a session-scoped fixture."""
    global _session
    if _session is None:
        problem = _missing()
        if problem:
            if os.environ.get("CI", "").lower() == "true":
                pytest.fail(f"CI=true and {problem}", pytrace=False)
            pytest.skip(problem)
        binary = shutil.which("podman")
        assert binary is not None
        conf = tmp_path_factory.mktemp("podman") / "containers.conf"
        conf.write_text(CONTAINERS_CONF)
        podman = Podman(binary=binary, conf=conf)
        _remove_stale_links()
        _ensure_image(podman)
        _session = podman
    return _session


def _missing() -> str:
    """Why podman cannot run the CDI tests here, or ''."""
    absent = [name for name in ("podman", "runc", "busybox") if shutil.which(name) is None]
    if absent:
        return f"podman CDI tests: {', '.join(absent)} not on PATH ({INSTALL_HINT})"
    busybox = shutil.which("busybox")
    assert busybox is not None
    if not _static(Path(busybox)):
        return f"podman CDI tests: {busybox} is dynamically linked ({INSTALL_HINT})"
    if os.geteuid() != 0:
        return f"podman CDI tests: need root (they publish CDI specs in {CDI_DIR})"
    return ""


def _static(binary: Path) -> bool:
    """An ELF64 little-endian executable without an interpreter (PT_INTERP)."""
    with binary.open("rb") as f:
        header = f.read(64)
        if header[:4] != b"\x7fELF" or header[4] != 2 or header[5] != 1:
            return False
        phoff = int.from_bytes(header[0x20:0x28], "little")
        entry = int.from_bytes(header[0x36:0x38], "little")
        count = int.from_bytes(header[0x38:0x3A], "little")
        f.seek(phoff)
        table = f.read(entry * count)
    return all(
        int.from_bytes(table[i * entry : i * entry + 4], "little") != _PT_INTERP
        for i in range(count)
    )


def _ensure_image(podman: Podman) -> None:
    """Import the busybox image unless it exists; under a lock, for concurrent sessions."""
    with _IMAGE_LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        exists = subprocess.run(
            [podman.binary, "image", "exists", podman.image],
            env=podman._env(),
            capture_output=True,
            timeout=60,
            check=False,
        )
        if exists.returncode == 0:
            return
        busybox = shutil.which("busybox")
        assert busybox is not None
        imported = subprocess.run(
            [podman.binary, "import", "-", podman.image],
            input=_rootfs_tar(Path(busybox)),
            env=podman._env(),
            capture_output=True,
            timeout=120,
            check=False,
        )
        assert imported.returncode == 0, f"podman import failed: {imported.stderr.decode()}"


def _rootfs_tar(busybox: Path) -> bytes:
    """A root file system of busybox and its applets' links, as a tar stream."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for directory in ("bin", "dev", "etc", "proc", "sys", "tmp"):
            info = tarfile.TarInfo(directory)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if directory == "tmp" else 0o755
            tar.addfile(info)
        tar.add(busybox, arcname="bin/busybox")
        for applet in _APPLETS:
            info = tarfile.TarInfo(f"bin/{applet}")
            info.type, info.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(info)
    return buffer.getvalue()


def _remove_stale_links() -> None:
    """Links this helper left in /var/run/cdi from sessions that were killed."""
    pattern = re.compile(rf"^{re.escape(_LINK_PREFIX)}(\d+)-[0-9a-f]+\.json$")
    for path in CDI_DIR.glob(f"{_LINK_PREFIX}*.json") if CDI_DIR.is_dir() else ():
        match = pattern.match(path.name)
        if match and path.is_symlink() and not Path(f"/proc/{match.group(1)}").exists():
            path.unlink(missing_ok=True)
