#!/usr/bin/env bash
# The main job: an ImageNet-pretrained EfficientNet-Lite0 (ONNX) fine-tuned to find defective solar
# cells (ELPV) and exported as a verified ONNX; then the validation accuracy table of the run.
# `bash scripts/demo.sh detect`: the detection example instead — an SSD on the same backbone learns
# digits 0-4 on real photos, then fine-tunes to new classes 5-9 (recipes/detect_digits_ssd.yaml),
# exports symbol + ONNX (per-class NMS, verified), prints the per-class AP table and draws boxes.
# `bash scripts/demo.sh segment`: semantic segmentation — an LR-ASPP head on the same backbone learns
# the pixels of the digits (recipes/segment_digits.yaml), exports ONNX (logits + mask, verified),
# prints the per-class IoU table and writes colour masks and overlays of 3 val images.
# Other arguments go to `gluontl finetune` (e.g. --set train.epochs=4).
source "$(dirname "$0")/env.sh"
export GLUONTL_HOME="${GLUONTL_HOME:-$HOME/.cache/gluontl}"
recipe=recipes/elpv_efficientnet_lite0.yaml
if [ "${1:-}" = detect ]; then
  recipe=recipes/detect_digits_ssd.yaml
  shift
elif [ "${1:-}" = segment ]; then
  recipe=recipes/segment_digits.yaml
  shift
fi
python scripts/make_imagenet_onnx.py
log=$(mktemp)
trap 'rm -f "$log"' EXIT
gluontl finetune --recipe "$recipe" "$@" | tee "$log"
# the run folder this finetune wrote, from its last line ("done: best …; run folder PATH")
run="$(sed -n 's/^done: .*; run folder //p' "$log" | tail -1)"
gluontl evaluate "$run"
if [ "$recipe" = recipes/detect_digits_ssd.yaml ]; then
  val="$GLUONTL_HOME/datasets/digits_det/v1/JPEGImages"
  gluontl predict "$run" "$val/01403.jpg" "$val/01404.jpg" "$val/01405.jpg" --out "$run/predictions"
elif [ "$recipe" = recipes/segment_digits.yaml ]; then
  val="$GLUONTL_HOME/datasets/digits_seg/v1/JPEGImages"
  gluontl predict "$run" "$val/00800.jpg" "$val/00801.jpg" "$val/00802.jpg" --out "$run/predictions"
fi
