#!/usr/bin/env bash
# Build the rendered Apptainer definitions into containers/sif/<name>.sif (apptainer >= 1.0).
# The .def files come from containers/images.yaml: `sdbench containers render`, then
# `sdbench containers check`.
#   bash containers/build.sh                      # every definition
#   bash containers/build.sh sdbench-analysis ... # some, by name
set -euo pipefail
cd "$(dirname "$0")" # the %files paths (../src, ...) are relative to this directory
mkdir -p sif
if [ "$#" -eq 0 ]; then set -- *.def; fi
for name in "$@"; do
    name="${name%.def}"
    apptainer build --force "sif/${name}.sif" "${name}.def"
done
