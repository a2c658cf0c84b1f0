#!/usr/bin/env bash
# Proves Python 3.12 can install gluontl without a 3.12 interpreter: pip resolves setup.cfg's
# dependencies with the test and demo extras (and theirs, numpy pinned by
# scripts/constraints-np126.txt) for CPython 3.12 on manylinux x86_64 (glibc 2.17 to 2.28) and
# downloads them, wheels only (--only-binary=:all:), so a dependency without a 3.12 wheel fails.
# It needs PyPI, and tests use no network, so it is a set-up check: scripts/test.sh runs it, and a
# pass is remembered per setup.cfg, constraints and script in the venv it runs from. About 380 MB.
source "$(dirname "$0")/env.sh"
constraints="$root/scripts/constraints-np126.txt"
inputs=("$root/setup.cfg" "$constraints" "$root/scripts/check_py312.sh")
stamp="$venv/.gluontl-py312-$(sha256sum "${inputs[@]}" | sha256sum | cut -c1-16)"
if [ -f "$stamp" ]; then
  echo "Python 3.12: every dependency has a wheel (checked before for this setup.cfg)" >&2
  exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
trap 'exit 143' TERM  # scripts/test.sh ends it when the tests fail first; the EXIT trap cleans up
python - "$root/setup.cfg" > "$tmp/requirements.txt" <<'EOF'
import configparser, sys
cfg = configparser.ConfigParser()
cfg.read(sys.argv[1])
for value in (cfg["options"]["install_requires"], *cfg["options.extras_require"].values()):
    for line in value.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            print(line.strip())
EOF
platforms=()
for glibc in $(seq 28 -1 17); do platforms+=(--platform "manylinux_2_${glibc}_x86_64"); done
platforms+=(--platform manylinux2014_x86_64)  # pip adds manylinux2010 and manylinux1
download() {
  python -m pip download -q --only-binary=:all: --python-version 3.12 "${platforms[@]}" -d "$tmp/wheels" "$@" \
    > "$tmp/pip.log" 2>&1 || { grep -v "is ignored: it is neither" "$tmp/pip.log" >&2; return 1; }
}
if ! download -c "$constraints" -r "$tmp/requirements.txt" || ! download --no-deps "${no_deps[@]}"; then
  echo "error: Python 3.12 cannot install gluontl: a dependency above has no CPython 3.12 manylinux" \
       "wheel in a version setup.cfg allows (or PyPI was not reached). Loosen that pin in setup.cfg to a" \
       "release with 3.12 wheels, keeping numpy < 2." >&2
  exit 1
fi
numpy_wheel="$(cd "$tmp/wheels" && ls numpy-*.whl)"
echo "Python 3.12: every dependency has a wheel ($(ls "$tmp/wheels" | wc -l) wheels, $numpy_wheel)" >&2
touch "$stamp"
