#!/usr/bin/env bash
# The test command: sets up the venv if needed, then runs the whole suite in random order
# (pytest-randomly prints its seed: --randomly-seed=N repeats an order, -p no:randomly
# keeps file order). oneDNN picks its kernels per CPU, and AVX2 and AVX-512 kernels sum
# in different orders: on a CPU with AVX-512 the suite runs a second time limited to AVX2
# (DNNL_MAX_CPU_ISA=AVX2), so what AVX2-only machines compute is tested here too. That pass leaves
# out the tests whose assertions no kernel choice can change (they compare a run with another run on
# the same machine — resumes, frozen arrays, restored rows — or check files, messages and processes):
# distributed jobs, signals and kill -9, CLI input, recipes, logs, data readers, checkpoints, guards,
# detector restores and runs — keeping CI under 20 minutes. What stays compares numbers against
# references: the ONNX importer, exports against onnxruntime, training steps, caches, mAP.
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
  not_kernels=(tests/distributed tests/test_interrupt.py tests/test_cli_hostile.py tests/test_cli_recipes.py
               tests/test_recipe_fuzz.py tests/test_recipe_null.py tests/test_atomic.py tests/test_api_consistency.py
               tests/train/test_logs.py tests/train/test_data.py tests/train/test_split.py tests/train/test_faults.py
               tests/detect/test_formats.py tests/detect/test_synth.py tests/detect/test_detect_data.py
               tests/train/test_checkpoint.py tests/train/test_guards.py tests/train/test_demo.py
               tests/detect/test_models.py tests/detect/test_detect_loop.py tests/detect/test_draw.py
               tests/test_random_init.py)
  DNNL_MAX_CPU_ISA=AVX2 python -m pytest tests -n "$workers" "${not_kernels[@]/#/--ignore=}" "$@"
fi
