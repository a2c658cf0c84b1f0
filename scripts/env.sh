#!/usr/bin/env bash
# Creates (once) and activates the project venv from the repo's own files.
# Re-installs when setup.cfg, pyproject.toml, the numpy pin or the Python changes. Sourced by
# scripts/demo.sh, scripts/test.sh and .ci/run.
# Python: $PYTHON if set, else the first of python3.11, python3.12, python3 that runs 3.11 or 3.12
# (3.11 first: the pinned numpy below has no 3.12 wheels). numpy: GLUONTL_NUMPY=1.23 or 1.26 picks
# scripts/constraints-np123.txt or -np126.txt; by default 1.23 on Python 3.11 (the numpy every
# number in the README was measured on) and 1.26 on 3.12 (the first numpy with 3.12 wheels).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${GLUONTL_VENV:-$root/.venv}"
# Test fixtures: PaddleOCR's real det/cls/rec ONNX models ship inside this package; its own
# dependencies are not needed (and would pull numpy 2), so it goes in without them.
no_deps=(rapidocr-onnxruntime==1.4.4)
version_of() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null; }
py="" py_version="" tried=""
for candidate in ${PYTHON:-python3.11 python3.12 python3}; do
  v="$(version_of "$candidate" || true)"
  tried="$tried $candidate (${v:-does not run})"
  if [ "$v" = 3.11 ] || [ "$v" = 3.12 ]; then
    py="$candidate" py_version="$v"
    break
  fi
done
if [ -z "$py" ]; then
  echo "error: gluontl needs Python 3.11 or 3.12 (mxnet 1.9.1 needs numpy < 2, which has no wheels for" \
       "Python 3.13 and later), and found none; tried:$tried. Install python3.12 or python3.11" \
       "(with its venv module), or set PYTHON to one." >&2
  return 2 2>/dev/null || exit 2
fi
numpy_pin="${GLUONTL_NUMPY:-$([ "$py_version" = 3.11 ] && echo 1.23 || echo 1.26)}"
constraints="$root/scripts/constraints-np${numpy_pin//./}.txt"
if [ ! -f "$constraints" ] || { [ "$numpy_pin" = 1.23 ] && [ "$py_version" != 3.11 ]; }; then
  echo "error: GLUONTL_NUMPY=$numpy_pin with Python $py_version ($py): use 1.23 (Python 3.11 only; numpy" \
       "1.23 has no 3.12 wheels) or 1.26, or leave it unset." >&2
  return 2 2>/dev/null || exit 2
fi
inputs=("$root/setup.cfg" "$root/pyproject.toml" "$constraints")
stamp="$venv/.gluontl-setup-$( (sha256sum "${inputs[@]}"; echo "$py_version") | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  echo "setting up $venv with $py (Python $py_version) and numpy $numpy_pin (one time; a few minutes) ..." >&2
  clear=""  # a venv of another Python is built anew, not upgraded in place
  [ -x "$venv/bin/python" ] && [ "$(version_of "$venv/bin/python" || true)" != "$py_version" ] && clear=--clear
  "$py" -m venv $clear "$venv"
  quiet() { grep -v "is ignored: it is neither a file nor a directory" || true; }
  "$venv/bin/python" -m pip install -q --upgrade pip 2>&1 | quiet
  # setuptools' note that an editable install imports through a finder ("Editable installation.",
  # 10 lines) is a warning recent pip (26.3 here) shows for local builds; it asks nothing of the user
  PYTHONWARNINGS="ignore:Editable installation:UserWarning" \
    "$venv/bin/python" -m pip install -q -c "$constraints" -e "$root[test,demo]" 2>&1 | quiet
  "$venv/bin/python" -m pip install -q --no-deps "${no_deps[@]}" 2>&1 | quiet
  rm -f "$venv"/.gluontl-setup-*
  touch "$stamp"
fi
export PATH="$venv/bin:$PATH"
cd "$root"
