#!/usr/bin/env bash
# The fuzz tests run long: every test marked `fuzz` (tests/fuzzing.py: a reader on mutated real
# files, in a worker under a memory cap and a time bound), N inputs each with fresh random seeds
# instead of CI's fixed ones. N is the first argument (default 2000); other arguments go to pytest,
# e.g. `scripts/fuzz.sh 500 -k yolo`. A failure prints the input hypothesis shrank it to; what
# earlier long runs found is in docs/testing.md ("Fuzzing").
set -euo pipefail
cd "$(dirname "$0")/.."
[ -n "${VIRTUAL_ENV:-}" ] || source "$(dirname "$0")/env.sh"
examples="${1:-2000}"
shift || true
export GLUONTL_FUZZ_EXAMPLES="$examples" OMP_NUM_THREADS=1
exec python -m pytest -m fuzz -n 0 -p no:randomly -p no:cacheprovider --durations=0 -q "$@" tests
