#!/usr/bin/env bash
# The test command: sets up the venv if needed, then runs the whole suite in random order
# (pytest-randomly prints its seed: --randomly-seed=N repeats an order, -p no:randomly
# keeps file order). oneDNN picks its kernels per CPU, and AVX2 and AVX-512 kernels sum
# in different orders: on a CPU with AVX-512 the suite runs a second time limited to AVX2
# (DNNL_MAX_CPU_ISA=AVX2), so what AVX2-only machines compute is tested here too; that pass leaves
# out the multi-process job tests (marker `jobs`: process orchestration, not kernels).
# Tests run in one worker per core (pytest-xdist; most of a test is single-threaded Python),
# each with one OpenMP thread; `-n 0` runs them in this process.
source "$(dirname "$0")/env.sh"
workers=$(nproc 2>/dev/null || echo 1)
if [ "$workers" -gt 1 ]; then
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
fi
python -m pytest tests -n "$workers" "$@"
if [ -z "${DNNL_MAX_CPU_ISA:-}" ] && grep -qw avx512f /proc/cpuinfo 2>/dev/null; then
  echo "AVX-512 CPU: running the suite again with DNNL_MAX_CPU_ISA=AVX2" >&2
  DNNL_MAX_CPU_ISA=AVX2 python -m pytest tests -n "$workers" -m "not jobs" "$@"
fi
