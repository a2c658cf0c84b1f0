#!/usr/bin/env bash
# The main job on the bundled offline demo: fine-tune a digits-0-4 ResNet-18 on digits 5-9.
source "$(dirname "$0")/env.sh"
gluontl finetune --recipe recipes/resnet18_freeze.yaml "$@"
