#!/usr/bin/env bash
# Build the rendered Apptainer definitions into containers/sif/<name>.sif (apptainer >= 1.0).
# The .def files come from containers/images.yaml: `sdbench containers render`, then
# `sdbench containers check`.
#   bash containers/build.sh                      # every definition
#   bash containers/build.sh sdbench-analysis ... # some, by name
#
# As a cluster user (not root) it builds with --fakeroot. A vLLM base image is ~10 GB
# compressed: its layers are cached and the image assembled on node-local disk, never in $HOME.
# Environment:
#   APPTAINER_BUILD        the build command (default: `apptainer build`, plus --fakeroot when
#                          not root); a site's own, e.g. "sudo apptainer build"
#   SDBENCH_BUILD_SCRATCH  where the two directories below go (default: $TMPDIR, else /tmp)
#   APPTAINER_CACHEDIR     pulled layers (default: $SDBENCH_BUILD_SCRATCH/apptainer-$USER/cache)
#   APPTAINER_TMPDIR       the image being assembled (default: .../apptainer-$USER/tmp)
#   SDBENCH_BUILD_MIN_FREE_GB  free space each must have (default 20)
set -euo pipefail
cd "$(dirname "$0")" # the %files paths (../src, ...) are relative to this directory

fail() { echo "build.sh: $*" >&2; exit 1; }

scratch="${SDBENCH_BUILD_SCRATCH:-${TMPDIR:-/tmp}}/apptainer-$(id -un)"
export APPTAINER_CACHEDIR="${APPTAINER_CACHEDIR:-$scratch/cache}"
export APPTAINER_TMPDIR="${APPTAINER_TMPDIR:-$scratch/tmp}"
need_gb="${SDBENCH_BUILD_MIN_FREE_GB:-20}"
for var in APPTAINER_CACHEDIR APPTAINER_TMPDIR; do
    dir="${!var}"
    mkdir -p "$dir" 2>/dev/null ||
        fail "cannot create $var=$dir; set $var (or SDBENCH_BUILD_SCRATCH) to a writable node-local directory"
    free_kb="$(df -Pk "$dir" | awk 'NR == 2 {print $4}')"
    [ "$free_kb" -ge $((need_gb * 1024 * 1024)) ] ||
        fail "$var=$dir has $((free_kb / 1024 / 1024)) GB free, a build needs ${need_gb} GB; set $var (or SDBENCH_BUILD_SCRATCH) to a larger node-local disk"
done

if [ -n "${APPTAINER_BUILD:-}" ]; then
    read -ra build <<<"$APPTAINER_BUILD"
elif [ "$(id -u)" -eq 0 ]; then
    build=(apptainer build)
else
    build=(apptainer build --fakeroot)
fi

mkdir -p sif
if [ "$#" -eq 0 ]; then set -- *.def; fi
for name in "$@"; do
    name="${name%.def}"
    "${build[@]}" --force "sif/${name}.sif" "${name}.def"
done
