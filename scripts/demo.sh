#!/usr/bin/env bash
# The main job: an ImageNet-pretrained EfficientNet-Lite0 (ONNX) fine-tuned to find defective solar
# cells (ELPV) and exported as a verified ONNX; then the validation accuracy table of the run.
# Arguments go to `gluontl finetune` (e.g. --set train.epochs=4).
source "$(dirname "$0")/env.sh"
export GLUONTL_HOME="${GLUONTL_HOME:-$HOME/.cache/gluontl}"
python scripts/make_imagenet_onnx.py
log=$(mktemp)
trap 'rm -f "$log"' EXIT
gluontl finetune --recipe recipes/elpv_efficientnet_lite0.yaml "$@" | tee "$log"
# the run folder this finetune wrote, from its last line ("done: best …; run folder PATH")
gluontl evaluate "$(sed -n 's/^done: .*; run folder //p' "$log" | tail -1)"
