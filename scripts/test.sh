#!/usr/bin/env bash
# The test command: sets up the venv if needed, then runs the whole suite in random order
# (pytest-randomly prints its seed: --randomly-seed=N repeats an order, -p no:randomly
# keeps file order). Arguments go to every pytest run.
# Then two more passes, each in a venv of its own, so every numpy gluontl supports is tested:
# 2. Python 3.13 with numpy 2 (`$venv-py313`; the Python is $GLUONTL_PY313, else python3.13, else
#    pyenv's 3.13), on a CPU with AVX-512 also limited to AVX2 (DNNL_MAX_CPU_ISA=AVX2): oneDNN picks
#    its kernels per CPU, and AVX2 and AVX-512 kernels sum in different orders, so what AVX2-only
#    machines compute is tested here too. It leaves out the tests whose assertions neither a kernel
#    nor numpy's version can change (they compare a run with another run on the same machine —
#    resumes, frozen arrays, restored rows — or check files, messages and processes): distributed
#    jobs, signals and kill -9, CLI input, recipes, logs, checkpoints, guards, detector restores and
#    runs, callbacks and early stopping, and the services (sweeps' Optuna workers, PostgreSQL and
#    dashboard; the MLflow server). What stays compares numbers against references: the ONNX importer, exports against
#    onnxruntime, training steps, caches, mAP, and the data readers and transforms, whose bytes
#    numpy 2's promotion could change (tests/data/test_data.py runs DataLoader workers under spawn
#    and forkserver).
# 3. numpy 1.26 (`$venv-np126`, Python 3.11 or 3.12), a targeted subset: numpy 1's promotion, as
#    1.23 has it, but without the aliases numpy 1.24 removed (np.bool, np.float, ...), which
#    gluontl.npcompat defines there as what they were (numpy 2 has np.bool again, as np.bool_): the
#    layer and its start-up hook, the pipelines' bytes, the MXNet facts, and the preprocessing,
#    transforms and metrics whose MXNet and GluonCV code reads those names.
# A pass whose numpy the first venv has already is skipped; when the first venv is numpy 2 (Python
# 3.13), pass 2 runs in it with AVX2 kernels on an AVX-512 CPU (elsewhere it would repeat pass 1).
# No Python 3.13 here: pass 2 runs on numpy 1.26 instead (with a note), unless
# GLUONTL_NUMPY2_PASS=1 (CI's .ci/run sets it), which makes that an error.
# Timings on 2 cores: docs/testing.md.
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
np126=()  # on Python 3.12 the first venv has numpy 1.26 already
[ "$numpy_pin" = 1.26 ] || np126=(GLUONTL_VENV="$venv-np126" GLUONTL_NUMPY=1.26)
np2=()  # on Python 3.13 (numpy 2) the first venv is that venv already
if [ "$numpy_pin" != 2 ]; then
  py313="${GLUONTL_PY313:-}"
  if [ -z "$py313" ]; then
    for candidate in python3.13 "$(pyenv root 2>/dev/null)"/versions/3.13*/bin/python3.13; do
      if [ "$("$candidate" -c 'import sys; print(sys.version_info[:2] == (3, 13))' 2>/dev/null)" = True ]; then
        py313="$candidate"
        break
      fi
    done
  fi
  if [ -n "$py313" ]; then
    np2=(GLUONTL_VENV="$venv-py313" GLUONTL_NUMPY=2 PYTHON="$py313")
  elif [ "${GLUONTL_NUMPY2_PASS:-0}" = 1 ]; then
    echo "error: the numpy 2 pass needs Python 3.13, and neither python3.13 nor pyenv's 3.13 runs here." \
         "Install it (pyenv install 3.13) or set GLUONTL_PY313 to one." >&2
    exit 2
  else
    echo "note: no Python 3.13 here (python3.13, pyenv's 3.13 or \$GLUONTL_PY313), so numpy 2 is not" \
         "tested; the AVX2 pass runs on numpy 1.26 instead. Install it (pyenv install 3.13) to test numpy 2." >&2
  fi
fi
prep_log="$(mktemp)"
# the numpy 1.26 venv takes Python 3.11 or 3.12 (env.sh's own choice), whatever $PYTHON the first had
(bash scripts/check_wheels.sh && { [ ${#np126[@]} -eq 0 ] || env -u PYTHON "${np126[@]}" bash scripts/env.sh; } \
  && { [ ${#np2[@]} -eq 0 ] || env "${np2[@]}" bash scripts/env.sh; }) > "$prep_log" 2>&1 &
prep=$!
trap 'kill "$prep" 2>/dev/null || true; rm -f "$prep_log"' EXIT
python -m pytest tests -n "$workers" "$@"
wait "$prep" || { cat "$prep_log" >&2; exit 1; }
grep -v "is ignored: it is neither a file nor a directory" "$prep_log" >&2 || true
not_kernels=(tests/dist tests/train/test_interrupt.py tests/test_cli_hostile.py tests/test_cli_recipes.py
             tests/test_recipe_fuzz.py tests/test_recipe_null.py tests/test_atomic.py tests/test_api_consistency.py
             tests/train/test_logs.py tests/data/test_data.py tests/tasks/test_split.py tests/train/test_faults.py
             tests/detect/test_formats.py tests/detect/test_synth.py tests/detect/test_detect_data.py
             tests/data/test_checkpoint.py tests/data/test_guards.py tests/data/test_demo.py
             tests/detect/test_models.py tests/detect/test_detect_loop.py tests/detect/test_draw.py
             tests/sources/test_random_init.py tests/test_layers.py tests/onnx/test_inspect.py tests/train/test_gpu.py
             tests/detect/test_detect_transforms.py tests/segment/test_seg_synth.py tests/test_docs.py
             tests/segment/test_seg_recipe.py tests/segment/test_seg_data.py tests/segment/test_seg_draw.py
             tests/segment/test_seg_int8.py tests/sweep tests/train/test_mlflow.py tests/train/test_callbacks.py
             tests/train/test_early_stopping.py tests/train/test_run_records.py tests/test_runfolder.py
             tests/test_runfolder_names.py tests/recipe tests/train/test_imbalance_loop.py tests/data/test_demo_graded.py)
numbers_only=("${not_kernels[@]/#/--ignore=}")
# the numpy 2 pass also runs the data readers and transforms, whose bytes numpy's promotion could change
numpy2_keeps=(tests/data/test_data.py tests/detect/test_detect_data.py tests/detect/test_detect_transforms.py
              tests/segment/test_seg_data.py)
numpy2_only=()
for t in "${not_kernels[@]}"; do
  [[ " ${numpy2_keeps[*]} " == *" $t "* ]] || numpy2_only+=("--ignore=$t")
done
# numpy 1.26's own tests (pass 3): what reads the aliases numpy 1.24 removed, and numpy's version
numpy126_tests=(tests/test_npcompat.py tests/test_numpy_bytes.py tests/test_platform_facts.py
                tests/test_deploy_preprocess.py tests/data/test_preprocess.py tests/detect/test_detect_transforms.py
                tests/detect/test_detect_metrics.py tests/detect/test_gluoncv_pitfalls.py
                tests/segment/test_seg_augment.py)
isa="${DNNL_MAX_CPU_ISA:-}"
if [ -z "$isa" ] && grep -qw avx512f /proc/cpuinfo 2>/dev/null; then
  isa=AVX2
fi
# pass 2: numpy 2 with AVX2 kernels (in the first venv when it is numpy 2; on numpy 1.26 without a 3.13)
kernel_tests=("${numpy2_only[@]}")
if [ ${#np2[@]} -gt 0 ]; then
  export "${np2[@]}"
elif [ "$numpy_pin" != 2 ]; then
  kernel_tests=("${numbers_only[@]}")
  if [ ${#np126[@]} -gt 0 ]; then
    unset PYTHON
    export "${np126[@]}"
  fi
  np126=()  # pass 3's tests are in this pass
fi
if [ ${#np2[@]} -eq 0 ] && [ "$numpy_pin" = 2 ] && [ -z "$isa" ]; then
  echo "pass 2: skipped (the first pass ran numpy 2 with these kernels already)" >&2
else
  source scripts/env.sh
  echo "pass 2: Python $(python -c 'import platform; print(platform.python_version())')," \
       "numpy $(python -c 'import numpy; print(numpy.__version__)')${isa:+, DNNL_MAX_CPU_ISA=$isa}" >&2
  # exit code 5 (nothing collected): the arguments chose only tests this pass leaves out
  env ${isa:+DNNL_MAX_CPU_ISA=$isa} python -m pytest tests -n "$workers" "${kernel_tests[@]}" "$@" || [ $? -eq 5 ]
fi
if [ ${#np126[@]} -gt 0 ]; then
  unset PYTHON
  export "${np126[@]}"
  source scripts/env.sh
  echo "pass 3: Python $(python -c 'import platform; print(platform.python_version())')," \
       "numpy $(python -c 'import numpy; print(numpy.__version__)')" >&2
  python -m pytest -n "$workers" "${numpy126_tests[@]}" "$@" || [ $? -eq 5 ]
fi
