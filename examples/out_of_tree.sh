#!/usr/bin/env bash
# refcheck on a kernel author's own package, outside this checkout, as a new user gets it: refcheck
# built as a wheel and installed (not editable) into a fresh virtual environment, the example package
# copied to a folder of its own, and every command run from there (examples/my_simple_gla/prove.py
# says what is checked). Usage: bash examples/out_of_tree.sh [WORKDIR]   (default: a new temp folder,
# removed at the end: its venv takes about 2 GB)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
if [ $# -ge 1 ]; then
  work="$1"
else
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
fi
mkdir -p "$work"
echo "out-of-tree check in $work"
python3 -m pip wheel -q --no-deps -w "$work/dist" "$repo"
python3 -m venv "$work/venv"
source "$work/venv/bin/activate"        # as the user has it: `python`, `pytest`, `refcheck` from this venv
python -m pip install -q --upgrade pip
wheel=$(ls "$work"/dist/refcheck-*.whl)
python -m pip install -q torch==2.13.0 "${wheel}[pytest]"
rm -rf "$work/user" && cp -r "$repo/examples/my_simple_gla" "$work/user"
cd "$work/user"
python -c "import refcheck; assert '$repo' not in refcheck.__file__, refcheck.__file__; print('refcheck from', refcheck.__file__)"
python prove.py
