#!/bin/sh
# The Makefile's virtual environment: `scripts/venv.sh VENV` leaves VENV a virtual environment
# of a supported Python whose pip imports, and says so on one line when it cannot.
#
#   - VENV is kept when its Python runs, is a supported version and imports pip;
#   - otherwise (none yet, half made by an interrupted or failed install, made by another
#     Python, or its Python was removed) it is rebuilt, so no one needs `make clean` first;
#   - the Python is $PYTHON when set, else the first of python3.12, python3.11, python3 that is
#     a supported version; none: one line naming the versions needed and those found, exit 1.
#
# `scripts/venv.sh --check VENV` only answers (exit 0: VENV is fine as it is).
# Supported: pyproject.toml's requires-python (>=3.11,<3.13), the Pythons Bytewax 0.21.1 has
# wheels for.
set -eu

SUPPORTED="3.11 3.12"
NEEDED="Python 3.11 or 3.12 (Bytewax 0.21.1 has no wheels for others)"

# The major.minor version of interpreter $1 ($2: more modules it must import); fails when it
# does not run.
version_of() {
    "$1" -c "import sys${2:+, $2}; print('%d.%d' % sys.version_info[:2])" 2>/dev/null
}

is_supported() {
    case " $SUPPORTED " in
    *" $1 "*) return 0 ;;
    esac
    return 1
}

# VENV is usable as it is.
venv_ok() {
    version=$(version_of "$1/bin/python" pip) && is_supported "$version"
}

# The interpreter to build VENV with, on stdout; one line on stderr and exit 1 when none fits.
pick_python() {
    if [ -n "${PYTHON:-}" ]; then
        candidates=$PYTHON
    else
        candidates="python3.12 python3.11 python3"
    fi
    found=""
    for python in $candidates; do
        if ! command -v "$python" >/dev/null 2>&1; then
            found="$found, $python: not found"
        elif version=$(version_of "$python"); then
            is_supported "$version" && {
                echo "$python"
                return 0
            }
            found="$found, $python: $version"
        else
            found="$found, $python: does not run"
        fi
    done
    echo "make: privstream needs $NEEDED; found ${found#, }: install python3.12 or python3.11, or name one with make PYTHON=/path/to/python3.12" >&2
    return 1
}

if [ "${1:-}" = --check ]; then
    venv_ok "$2"
    exit
fi
venv=$1
venv_ok "$venv" && exit 0
python=$(pick_python)
if [ -e "$venv" ]; then
    echo "make: $venv is not a usable Python 3.11/3.12 environment (an earlier install failed, or another Python made it): rebuilding it" >&2
fi
rm -rf "$venv"
echo "make: creating $venv with $python ($(version_of "$python"))" >&2
# A failed step removes the half-made environment: the next make starts afresh.
"$python" -m venv "$venv" || {
    rm -rf "$venv"
    exit 1
}
"$venv/bin/python" -m pip install --quiet --upgrade pip || {
    rm -rf "$venv"
    exit 1
}
