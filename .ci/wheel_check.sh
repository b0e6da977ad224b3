#!/usr/bin/env bash
# The wheel as a user installs it (issue 48 item 5): `python -m build` makes the sdist and the
# wheel with no warning; the wheel, not the checkout, goes into a fresh venv outside the source
# tree, where the demo, `hlofuse --help`, `hlofuse --version` and `hlofuse optimize` on the
# shipped example file run. Usage: .ci/wheel_check.sh PYTHON
set -euo pipefail
PY=${1:-python3}
SRC=$(cd "$(dirname "$0")/.." && pwd)
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
"$PY" -m venv "$W/build-venv"
"$W/build-venv/bin/pip" install -q build
( cd "$SRC" && env -u PYTHONDONTWRITEBYTECODE "$W/build-venv/bin/python" -m build --sdist --wheel \
    -o "$W/dist" . ) > "$W/build.log" 2>&1 || { cat "$W/build.log"; exit 1; }
# what setuptools says of this project (pip's notes on this machine's package index are not)
if grep -iE "warning|deprecat" "$W/build.log" | grep -v "WARNING: Location 'file://"; then
  echo "== wheel: the build printed warnings (above)"; exit 1
fi
ls "$W/dist"
"$PY" -m venv "$W/venv"
"$W/venv/bin/pip" install -q "$W"/dist/hlofuse-*.whl
cd "$W"   # outside the source tree: only the installed wheel can be imported
export JAX_PLATFORMS=cpu
venv/bin/python -c "import hlofuse, os; assert '$SRC' not in os.path.abspath(hlofuse.__file__), hlofuse.__file__; print('imported from', os.path.dirname(hlofuse.__file__))"
venv/bin/python -c "import hlofuse, os; assert os.path.isfile(os.path.join(os.path.dirname(hlofuse.__file__), 'py.typed'))"
venv/bin/hlofuse --version
venv/bin/hlofuse --help > /dev/null
EXAMPLE=$(venv/bin/python -c 'import hlofuse.examples as e; print(e.path())')
venv/bin/hlofuse optimize "$EXAMPLE" -o out.mlir --report report.md
test -s out.mlir && grep -q "stablehlo" out.mlir && test -s report.md
venv/bin/python -m hlofuse.cli.demo > demo.txt
tail -3 demo.txt
echo "== wheel: built without warnings, installed outside the tree, demo and CLI ran"
