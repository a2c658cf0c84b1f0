#!/usr/bin/env bash
# The test command: sets up the venv if needed, then runs the whole suite in random order
# (pytest-randomly prints its seed: --randomly-seed=N repeats an order, -p no:randomly
# keeps file order). Arguments go to every pytest run.
# Then two more passes, each in a venv of its own, so every numpy gluontl supports is tested:
# numpy 1.26 (the numpy Python 3.12 installs; the first venv has the pinned 1.23 on Python 3.11, see
# scripts/env.sh) and, with GLUONTL_NUMPY2_PASS=1, Python 3.13 with numpy 2 (the Python is
# $GLUONTL_PY313, else python3.13, else pyenv's 3.13; none found is an error). A pass whose numpy the
# first venv has already is skipped.
# On a CPU with AVX-512 the numpy 1.26 pass is also limited to AVX2 (DNNL_MAX_CPU_ISA=AVX2): oneDNN
# picks its kernels per CPU, and AVX2 and AVX-512 kernels sum in different orders, so what AVX2-only
# machines compute is tested here too. These passes leave out the tests whose assertions neither a
# kernel nor numpy's version can change (they compare a run with another run on the same machine —
# resumes, frozen arrays, restored rows — or check files, messages and processes):
# distributed jobs, signals and kill -9, CLI input, recipes, logs, checkpoints, guards,
# detector restores and runs — keeping CI under 25 minutes. What stays compares numbers against
# references: the ONNX importer, exports against onnxruntime, training steps, caches, mAP; the
# numpy 2 pass keeps the data readers and transforms too (tests/data/test_data.py runs DataLoader
# workers under spawn and forkserver).
# During the first pass, in the background, scripts/check_wheels.sh checks that Python 3.12, 3.13
# and 3.14 could install it all (it needs PyPI; the tests do not) and the other venvs are set up.
# Tests run in one worker per core (pytest-xdist; most of a test is single-threaded Python),
# each with one OpenMP thread; `-n 0` runs them in this process.
source "$(dirname "$0")/env.sh"
workers=$(nproc 2>/dev/null || echo 1)
if [ "$workers" -gt 1 ]; then
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
fi
# During the first pass, set-up for after it (mostly downloads): the wheel check, then the other venvs
second=()  # on Python 3.12 the first venv has numpy 1.26 already
[ "$numpy_pin" = 1.26 ] || second=(GLUONTL_VENV="$venv-np126" GLUONTL_NUMPY=1.26)
third=()  # on Python 3.13 (numpy 2) the first venv is that pass already
# The Python 3.13 + numpy 2 pass is opt-in (GLUONTL_NUMPY2_PASS=1) until the 13 tests it fails are
# fixed (issue 31's note lists them: onnx 1.20's conformance data and extract_model, gradient checks
# on two conv-after-reshape graphs, a temp file in the recipe fuzz); CI runs the first two passes.
if [ "${GLUONTL_NUMPY2_PASS:-0}" = 1 ] && [ "$numpy_pin" != 2 ]; then
  py313="${GLUONTL_PY313:-}"
  if [ -z "$py313" ]; then
    for candidate in python3.13 "$(pyenv root 2>/dev/null)"/versions/3.13*/bin/python3.13; do
      if [ "$("$candidate" -c 'import sys; print(sys.version_info[:2] == (3, 13))' 2>/dev/null)" = True ]; then
        py313="$candidate"
        break
      fi
    done
  fi
  if [ -z "$py313" ]; then
    echo "error: the numpy 2 pass needs Python 3.13, and neither python3.13 nor pyenv's 3.13 runs here." \
         "Install it (pyenv install 3.13) or set GLUONTL_PY313 to one." >&2
    exit 2
  fi
  third=(GLUONTL_VENV="$venv-py313" GLUONTL_NUMPY=2 PYTHON="$py313")
fi
prep_log="$(mktemp)"
# the numpy 1.26 venv takes Python 3.11 or 3.12 (env.sh's own choice), whatever $PYTHON the first had
(bash scripts/check_wheels.sh && { [ ${#second[@]} -eq 0 ] || env -u PYTHON "${second[@]}" bash scripts/env.sh; } \
  && { [ ${#third[@]} -eq 0 ] || env "${third[@]}" bash scripts/env.sh; }) > "$prep_log" 2>&1 &
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
numbers_only=("${not_kernels[@]/#/--ignore=}")
# the numpy 2 pass also runs the data readers and transforms, whose bytes numpy's promotion could change
numpy2_keeps=(tests/data/test_data.py tests/detect/test_detect_data.py tests/detect/test_detect_transforms.py
              tests/segment/test_seg_data.py)
numpy2_only=()
for t in "${not_kernels[@]}"; do
  [[ " ${numpy2_keeps[*]} " == *" $t "* ]] || numpy2_only+=("--ignore=$t")
done
if [ ${#second[@]} -gt 0 ]; then
  unset PYTHON
  export "${second[@]}"
  source scripts/env.sh
  isa="${DNNL_MAX_CPU_ISA:-}"
  if [ -z "$isa" ] && grep -qw avx512f /proc/cpuinfo 2>/dev/null; then
    isa=AVX2
  fi
  echo "numpy 1.26 pass: numpy $(python -c 'import numpy; print(numpy.__version__)')${isa:+, DNNL_MAX_CPU_ISA=$isa}" >&2
  # exit code 5 (nothing collected): the arguments chose only tests this pass leaves out
  env ${isa:+DNNL_MAX_CPU_ISA=$isa} python -m pytest tests -n "$workers" "${numbers_only[@]}" "$@" || [ $? -eq 5 ]
fi
if [ ${#third[@]} -gt 0 ]; then
  export "${third[@]}"
  source scripts/env.sh
  echo "numpy 2 pass: Python $(python -c 'import platform; print(platform.python_version())')," \
       "numpy $(python -c 'import numpy; print(numpy.__version__)')" >&2
  python -m pytest tests -n "$workers" "${numpy2_only[@]}" "$@" || [ $? -eq 5 ]
fi
