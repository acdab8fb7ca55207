#!/usr/bin/env bash
# Build the pinned Apptainer images into containers/sif/ (needs apptainer >= 1.0).
#   bash containers/build.sh            # all
#   bash containers/build.sh 0.10.1.1   # one
set -euo pipefail
cd "$(dirname "$0")"
mkdir -p sif
for def in sdbench-vllm-${1:-*}.def; do
    name="${def%.def}"
    apptainer build --force "sif/${name}.sif" "$def"
done
