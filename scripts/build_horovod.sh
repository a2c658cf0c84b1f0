#!/usr/bin/env bash
# Builds Horovod 0.28.1 from source into the project venv, for train.distributed.backend: horovod.
# MXNet only, with Gloo (no MPI, TensorFlow or PyTorch); about 5 minutes on 2 cores. Needs cmake (3.13+) and
# g++ (apt install cmake g++). Afterwards `horovodrun --check-build` lists MXNet and Gloo.
source "$(dirname "$0")/env.sh"
python -m pip install -q wheel "setuptools<70"
HOROVOD_WITH_MXNET=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MPI=1 \
HOROVOD_WITH_GLOO=1 CMAKE_POLICY_VERSION_MINIMUM=3.5 MAKEFLAGS="-j$(nproc)" \
  python -m pip install --no-cache-dir --no-build-isolation "horovod==0.28.1"
horovodrun --check-build
