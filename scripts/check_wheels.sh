#!/usr/bin/env bash
# Proves Pythons without an interpreter here can install gluontl: for CPython 3.12 (numpy 1.26,
# scripts/constraints-np126.txt) and 3.13 and 3.14 (numpy 2, scripts/constraints-np2.txt, mxnet
# repacked as 1.9.1+np2 as scripts/env.sh does), pip resolves setup.cfg's dependencies with the
# test and demo extras on manylinux x86_64 (glibc 2.17 to 2.28) and downloads them, wheels only
# (--only-binary=:all:), so a dependency without a wheel for that Python fails. setup.cfg's
# python_version markers are evaluated for each target; pip evaluates the dependencies' own markers
# for the Python it runs on: from a 3.13 or later runner only that version is checked.
# It needs PyPI, and tests use no network, so it is a set-up check: scripts/test.sh runs it, and a
# pass is remembered per setup.cfg, constraints and script in the venv it runs from. About 1.1 GB.
source "$(dirname "$0")/env.sh"
inputs=("$root/setup.cfg" "$root/scripts/constraints-np126.txt" "$root/scripts/constraints-np2.txt"
        "$root/scripts/check_wheels.sh" "$root/scripts/mxnet_np2_wheel.py")
stamp="$venv/.gluontl-wheels-$(sha256sum "${inputs[@]}" | sha256sum | cut -c1-16)"
if [ -f "$stamp" ]; then
  echo "Python 3.12, 3.13, 3.14: every dependency has a wheel (checked before for this setup.cfg)" >&2
  exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
trap 'exit 143' TERM  # scripts/test.sh ends it when the tests fail first; the EXIT trap cleans up
platforms=()
for glibc in $(seq 28 -1 17); do platforms+=(--platform "manylinux_2_${glibc}_x86_64"); done
platforms+=(--platform manylinux2014_x86_64)  # pip adds manylinux2010 and manylinux1
quiet() { grep -v "is ignored: it is neither" || true; }
# mxnet's own wheel, repacked without numpy<2 (the file is the same for every Python)
python -m pip download -q --no-deps mxnet==1.9.1 -d "$tmp/mxnet" 2>&1 | quiet
python "$root/scripts/mxnet_np2_wheel.py" "$tmp"/mxnet/mxnet-1.9.1-*.whl "$tmp/np2" > /dev/null
runner="$(python -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
for pv in 3.12 3.13 3.14; do
  if [ "$runner" != 3.11 ] && [ "$runner" != 3.12 ] && [ "$pv" != "$runner" ]; then
    # pip evaluates the dependencies' own markers for the Python it runs on (ml_dtypes asks numpy >= 2.1
    # on 3.13), which Python 3.11 and 3.12 runners get right for all three targets (measured) and a
    # 3.13 runner does not: from there only its own version is checked
    echo "Python $pv: not checked from Python $runner (checked from a 3.11 or 3.12 venv, as CI's default run does)" >&2
    continue
  fi
  # setup.cfg's markers (python_version) evaluated for the target, not for the Python pip runs on
  python - "$root/setup.cfg" "$pv" > "$tmp/requirements.txt" <<'PY'
import configparser, sys
try:
    from packaging.requirements import Requirement
except ImportError:
    from pip._vendor.packaging.requirements import Requirement
cfg = configparser.ConfigParser()
cfg.read(sys.argv[1])
env = {"python_version": sys.argv[2], "python_full_version": sys.argv[2] + ".0"}
for value in (cfg["options"]["install_requires"], *cfg["options.extras_require"].values()):
    for line in value.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            req = Requirement(line.strip())
            if req.marker is None or req.marker.evaluate(env):
                req.marker = None
                print(req)
PY
  constraints="$root/scripts/constraints-np2.txt" links=(--find-links "$tmp/np2")
  [ "$pv" = 3.12 ] && constraints="$root/scripts/constraints-np126.txt" links=()
  download() {
    python -m pip download -q --only-binary=:all: --python-version "$pv" "${platforms[@]}" -d "$tmp/$pv" "$@" \
      > "$tmp/pip.log" 2>&1 || { quiet < "$tmp/pip.log" >&2; return 1; }
  }
  # rapidocr-onnxruntime (test fixtures, data only) says Python < 3.13; env.sh installs it regardless
  if ! download -c "$constraints" "${links[@]}" -r "$tmp/requirements.txt" \
     || ! download --no-deps --ignore-requires-python "${no_deps[@]:1}"; then
    echo "error: Python $pv cannot install gluontl: a dependency above has no CPython $pv manylinux" \
         "wheel in a version setup.cfg allows (or PyPI was not reached). Loosen that pin in setup.cfg (for" \
         "python_version $pv) to a release with $pv wheels." >&2
    exit 1
  fi
  echo "Python $pv: every dependency has a wheel ($(ls "$tmp/$pv" | wc -l) wheels," \
       "$(cd "$tmp/$pv" && ls numpy-*.whl), $(cd "$tmp/$pv" && ls mxnet-*.whl | cut -d- -f2))" >&2
  rm -rf "${tmp:?}/$pv"  # keep the disk use to one Python's wheels at a time
done
touch "$stamp"
