#!/bin/sh
# Build privstream's container image without a container registry (`make image`).
#
#   1. the wheel of this checkout (its tracked and untracked, not ignored files) and a
#      wheelhouse of its dependencies, in dist/, with .venv's pip
#   2. unless BASE is another image: a Debian bookworm root filesystem (python3,
#      python3-venv, ca-certificates, passwd, libstdc++6 for numpy's wheel) made by mmdebstrap
#      from the Debian mirror and imported with `podman import` as
#      localhost/privstream-base:bookworm
#   3. deploy/Containerfile built on it with chroot isolation (its RUN needs neither a
#      container runtime nor cgroups) and no package index: pip installs from the wheelhouse
#
# Environment (default in brackets):
#   IMAGE   the image to tag, NAME:TAG [localhost/privstream:latest]; also NAME:VERSION
#   BASE    the base image [localhost/privstream-base:bookworm, built here]; e.g.
#           docker.io/library/python:3.11-slim-bookworm to use upstream's (pulled)
#   MIRROR  Debian mirror for mmdebstrap [http://deb.debian.org/debian]
#   PYTHON  the Python whose pip builds the wheels [.venv/bin/python]; its minor version must
#           be the base's (3.11 for bookworm), as the dependencies' wheels are built for it
# Missing tools (podman or buildah, mmdebstrap) are installed with apt-get (as root, or
# through `sudo -n`). Work files go to build/image/ and dist/, both git-ignored.
set -eu

cd "$(dirname "$0")/.."
IMAGE=${IMAGE:-localhost/privstream:latest}
LOCAL_BASE=localhost/privstream-base:bookworm
BASE=${BASE:-$LOCAL_BASE}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
PYTHON=${PYTHON:-.venv/bin/python}
WORK=build/image

step() { printf '\n==> %s\n' "$*" >&2; }
run() {
    printf '+ %s\n' "$*" >&2
    "$@"
}
die() {
    printf 'build-image: %s\n' "$*" >&2
    exit 1
}

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo -n"
as_root() {
    # shellcheck disable=SC2086 # "sudo -n" is two words, "" none
    run $SUDO "$@"
}

# The id of image $1, empty when there is none (or no podman).
image_id() {
    command -v podman >/dev/null 2>&1 || return 0
    # shellcheck disable=SC2086
    $SUDO podman image inspect --format '{{.Id}}' "$1" 2>/dev/null || true
}

# Remove image $1 (an id) once a rebuild has taken its last tag away.
drop_untagged() {
    [ -n "$1" ] || return 0
    # shellcheck disable=SC2086
    tags=$($SUDO podman image inspect --format '{{len .RepoTags}}' "$1" 2>/dev/null || echo gone)
    if [ "$tags" = 0 ]; then
        as_root podman rmi "$1" >/dev/null || true
    fi
}

install_tools() {
    missing=""
    command -v podman >/dev/null 2>&1 || command -v buildah >/dev/null 2>&1 || missing="podman"
    if [ "$BASE" = "$LOCAL_BASE" ] && ! command -v mmdebstrap >/dev/null 2>&1; then
        missing="$missing mmdebstrap"
    fi
    [ -n "$missing" ] || return 0
    step "installing$missing with apt-get"
    command -v apt-get >/dev/null 2>&1 || die "install$missing first (no apt-get here)"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get -q -o DPkg::Lock::Timeout=300 update
    # shellcheck disable=SC2086 # one word per package
    as_root env DEBIAN_FRONTEND=noninteractive apt-get -q -o DPkg::Lock::Timeout=300 \
        install -y --no-install-recommends $missing
}

build_wheels() {
    step "wheel and wheelhouse in dist/"
    [ -x "$PYTHON" ] || die "$PYTHON not found: run \`make install\` first"
    version=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    if [ "$BASE" = "$LOCAL_BASE" ] && [ "$version" != 3.11 ]; then
        die "$PYTHON is Python $version; Debian bookworm's python3 is 3.11 (set PYTHON)"
    fi
    # A fresh copy of the sources: setuptools' build/lib keeps files deleted since.
    run rm -rf "$WORK/src" dist
    run mkdir -p "$WORK/src" dist
    printf '+ git ls-files -co --exclude-standard | tar ... -C %s\n' "$WORK/src" >&2
    git ls-files -z -co --exclude-standard | tar -c --null --ignore-failed-read -T - -f - | tar -x -C "$WORK/src" -f -
    run "$PYTHON" -m pip wheel --quiet --no-deps --wheel-dir dist "$WORK/src"
    run "$PYTHON" -m pip wheel --quiet --wheel-dir dist dist/privstream-*.whl
    ls dist >&2
}

build_base() {
    step "Debian bookworm root filesystem with mmdebstrap, imported as $LOCAL_BASE"
    run mkdir -p "$WORK"
    as_root mmdebstrap --variant=essential \
        --include=python3,python3-venv,ca-certificates,passwd,libstdc++6 \
        --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/info/*' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        bookworm "$WORK/rootfs.tar" "$MIRROR"
    previous=$(image_id "$LOCAL_BASE")
    as_root podman import "$WORK/rootfs.tar" "$LOCAL_BASE"
    as_root rm -f "$WORK/rootfs.tar"
    drop_untagged "$previous"
}

build_image() {
    step "image $IMAGE from deploy/Containerfile on $BASE"
    context="$WORK/context"
    run rm -rf "$context"
    run mkdir -p "$context/deploy"
    run cp -R dist "$context/dist"
    run cp -p deploy/Containerfile deploy/entrypoint.sh "$context/deploy/"
    wheel=$(basename dist/privstream-*.whl)
    version=$(printf '%s' "$wheel" | cut -d- -f2)
    tagged="${IMAGE%:*}:$version"
    if command -v podman >/dev/null 2>&1; then
        builder="podman build"
    else
        builder="buildah bud"
    fi
    previous=$(image_id "$IMAGE")
    # shellcheck disable=SC2086 # "podman build" is two words
    as_root $builder --isolation=chroot --build-arg "BASE=$BASE" \
        -f "$context/deploy/Containerfile" -t "$IMAGE" -t "$tagged" "$context"
    drop_untagged "$previous"
}

started=$(date +%s)
install_tools
build_wheels
if [ "$BASE" = "$LOCAL_BASE" ]; then
    build_base
fi
build_image
run rm -rf "$WORK/src" "$WORK/context"
step "done in $(($(date +%s) - started)) s"
if command -v podman >/dev/null 2>&1; then
    as_root podman image ls --filter "reference=${IMAGE%:*}"
fi
