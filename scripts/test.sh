#!/usr/bin/env bash
# The test command: sets up the venv if needed, then runs the whole suite.
source "$(dirname "$0")/env.sh"
python -m pytest tests "$@"
