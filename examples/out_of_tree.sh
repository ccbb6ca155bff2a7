#!/usr/bin/env bash
# refcheck on a kernel author's own package, outside this checkout, as a new user gets it: refcheck
# built as a wheel and installed (not editable) into a fresh virtual environment, the example package
# copied to a folder of its own, and every command run from there (examples/my_simple_gla/prove.py
# says what is checked).
#
# Usage: bash examples/out_of_tree.sh [WORKDIR]            install, then check (default WORKDIR: a new temp
#                                                          folder, removed at the end: its venv takes about 2 GB)
#        bash examples/out_of_tree.sh --install WORKDIR  the wheel and the venv only
#        bash examples/out_of_tree.sh --check WORKDIR    the checks, in a WORKDIR that --install made
# (CI runs --install beside its own setup, each on one core of the two, and --check after its report.)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
mode=all
case "${1:-}" in
  --install|--check) mode="${1#--}"; shift ;;
esac
if [ $# -ge 1 ]; then
  work="$1"
elif [ "$mode" = all ]; then
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
else
  echo "usage: bash examples/out_of_tree.sh [--install | --check] WORKDIR" >&2
  exit 2
fi
mkdir -p "$work"

if [ "$mode" != check ]; then
  echo "out-of-tree install in $work"
  # the wheel is built from a copy of the sources (tracked files and untracked ones git does not ignore), so that
  # the build writes nothing into the checkout while something else (CI's own setup) works in it
  rm -rf "$work/src" && mkdir -p "$work/src"
  if git -C "$repo" rev-parse --is-inside-work-tree > /dev/null 2>&1; then
    (cd "$repo" && git ls-files -z --cached --others --exclude-standard \
       | xargs -0 sh -c 'for f; do [ -e "$f" ] && printf "%s\0" "$f"; done' sh \
       | tar --null -T - -cf -) | tar -xf - -C "$work/src"
  else
    cp -r "$repo/." "$work/src"
  fi
  python3 -m pip wheel -q --no-deps -w "$work/dist" "$work/src"
  python3 -m venv "$work/venv"            # with its own pip, as a new user's venv has it
  wheel=$(ls "$work"/dist/refcheck-*.whl)
  "$work/venv/bin/python" -m pip install -q torch==2.13.0 "${wheel}[pytest]"
fi

if [ "$mode" != install ]; then
  echo "out-of-tree check in $work"
  source "$work/venv/bin/activate"        # as the user has it: `python`, `pytest`, `refcheck` from this venv
  rm -rf "$work/user" && cp -r "$repo/examples/my_simple_gla" "$work/user"
  cd "$work/user"
  python -c "import refcheck; assert '$repo' not in refcheck.__file__, refcheck.__file__; print('refcheck from', refcheck.__file__)"
  python prove.py
fi
