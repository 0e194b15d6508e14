#!/usr/bin/env bash
# Podman as a real CDI runtime for tests/runtime_podman.py: podman, runc (crun
# fails on a cgroup v1 hybrid layout; the tests select runc in their containers.conf) and a
# statically linked busybox (the tests' image is busybox alone, imported without a registry).
# Idempotent: installs only what is missing; a no-op on a machine that has all three. Debian or
# Ubuntu (apt-get), as root or through sudo.
set -euo pipefail

missing=()
command -v podman >/dev/null 2>&1 || missing+=(podman)
command -v runc >/dev/null 2>&1 || missing+=(runc)
# The image needs a busybox that runs without a dynamic loader: Debian's `busybox` package is
# dynamically linked, `busybox-static` is not (and replaces it).
busybox_static() {
    local path
    path=$(command -v busybox 2>/dev/null) || return 1
    dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q "ok installed" && return 0
    # Not from the package: accept a busybox without an ELF interpreter (readelf can tell).
    command -v readelf >/dev/null 2>&1 || return 1
    LC_ALL=C readelf -l "$path" >/dev/null 2>&1 || return 1
    ! LC_ALL=C readelf -l "$path" | grep -q "Requesting program interpreter"
}
busybox_static || missing+=(busybox-static)

if [ ${#missing[@]} -eq 0 ]; then
    echo "install-podman: podman, runc and a static busybox are present ($(podman --version))"
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-podman: missing ${missing[*]} and no apt-get here; install them by hand" >&2
    exit 1
fi
sudo=()
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || {
        echo "install-podman: missing ${missing[*]}; run as root (no sudo here)" >&2
        exit 1
    }
    sudo=(sudo)
fi

echo "install-podman: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -q
"${sudo[@]}" apt-get install -y -q "${missing[@]}"
podman --version
