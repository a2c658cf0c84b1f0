#!/usr/bin/env bash
# The test command: sets up the venv if needed, then runs the whole suite in random order
# (pytest-randomly prints its seed: --randomly-seed=N repeats an order, -p no:randomly
# keeps file order). Arguments go to both pytest runs.
# Then a second pass, in a second venv with numpy 1.26 (the numpy Python 3.12 installs; the first
# venv has the pinned 1.23 on Python 3.11, see scripts/env.sh), so both numpys are tested. On a CPU
# with AVX-512 that pass is also limited to AVX2 (DNNL_MAX_CPU_ISA=AVX2): oneDNN picks its kernels
# per CPU, and AVX2 and AVX-512 kernels sum in different orders, so what AVX2-only machines compute
# is tested here too. That pass leaves out the tests whose assertions neither a kernel nor numpy's
# version can change (they compare a run with another run on the same machine — resumes, frozen
# arrays, restored rows — or check files, messages and processes):
# distributed jobs, signals and kill -9, CLI input, recipes, logs, data readers, checkpoints, guards,
# detector restores and runs — keeping CI under 20 minutes. What stays compares numbers against
# references: the ONNX importer, exports against onnxruntime, training steps, caches, mAP.
# During the first pass, in the background, scripts/check_py312.sh checks that Python 3.12 could
# install it all (it needs PyPI; the tests do not) and the second venv is set up.
# Tests run in one worker per core (pytest-xdist; most of a test is single-threaded Python),
# each with one OpenMP thread; `-n 0` runs them in this process.
source "$(dirname "$0")/env.sh"
workers=$(nproc 2>/dev/null || echo 1)
if [ "$workers" -gt 1 ]; then
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
fi
# During the first pass, set-up for after it (mostly downloads): the Python 3.12 check, then the second venv
second=()  # on Python 3.12 the first venv has numpy 1.26 already
[ "$numpy_pin" = 1.26 ] || second=(GLUONTL_VENV="$venv-np126" GLUONTL_NUMPY=1.26)
prep_log="$(mktemp)"
(bash scripts/check_py312.sh && env "${second[@]}" bash scripts/env.sh) > "$prep_log" 2>&1 &
prep=$!
trap 'kill "$prep" 2>/dev/null || true; rm -f "$prep_log"' EXIT
python -m pytest tests -n "$workers" "$@"
wait "$prep" || { cat "$prep_log" >&2; exit 1; }
grep -v "is ignored: it is neither a file nor a directory" "$prep_log" >&2 || true
not_kernels=(tests/distributed tests/train/test_interrupt.py tests/test_cli_hostile.py tests/test_cli_recipes.py
             tests/test_recipe_fuzz.py tests/test_recipe_null.py tests/test_atomic.py tests/test_api_consistency.py
             tests/train/test_logs.py tests/data/test_data.py tests/tasks/test_split.py tests/train/test_faults.py
             tests/detect/test_formats.py tests/detect/test_synth.py tests/detect/test_detect_data.py
             tests/data/test_checkpoint.py tests/data/test_guards.py tests/data/test_demo.py
             tests/detect/test_models.py tests/detect/test_detect_loop.py tests/detect/test_draw.py
             tests/sources/test_random_init.py tests/test_layers.py tests/onnx/test_inspect.py tests/train/test_gpu.py
             tests/detect/test_detect_transforms.py tests/segment/test_seg_synth.py tests/test_docs.py
             tests/segment/test_seg_recipe.py tests/segment/test_seg_data.py tests/segment/test_seg_draw.py
             tests/segment/test_seg_int8.py)
[ ${#second[@]} -eq 0 ] || { export "${second[@]}"; source scripts/env.sh; }
isa="${DNNL_MAX_CPU_ISA:-}"
if [ -z "$isa" ] && grep -qw avx512f /proc/cpuinfo 2>/dev/null; then
  isa=AVX2
fi
echo "second pass: numpy $(python -c 'import numpy; print(numpy.__version__)')${isa:+, DNNL_MAX_CPU_ISA=$isa}" >&2
# exit code 5 (nothing collected): the arguments chose only tests this pass leaves out
env ${isa:+DNNL_MAX_CPU_ISA=$isa} python -m pytest tests -n "$workers" "${not_kernels[@]/#/--ignore=}" "$@" \
  || [ $? -eq 5 ]
