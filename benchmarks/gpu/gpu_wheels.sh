#!/usr/bin/env bash
# Download the wheels of mcgpo's runtime dependencies that the device image lacks, for its
# Python 3.12 on manylinux x86_64, into .whl/ (ignored by git; name it in the run's carry).
#
#     benchmarks/gpu/gpu_wheels.sh [FOLDER]        # default .whl
#     IMAGE=/path/to/list benchmarks/gpu/gpu_wheels.sh
#
# Which ones: benchmarks/gpu/gpu_check_deps.py compares pyproject.toml's [project] dependencies
# with the image's package list in the device docs (KINDS.md; IMAGE= names another list, one
# name per line). Then every wheel's own requirements are checked against the image and the
# folder, and there must be one version per distribution (docs/reference/gpu.md, "The device check").
set -euo pipefail
cd "$(dirname "$0")/../.."
py=${PYTHON:-.venv/bin/python}
[ -x "$py" ] || py=python3
dest=${1:-.whl}
image=()
[ -n "${IMAGE:-}" ] && image=(--image "$IMAGE")
mapfile -t reqs < <("$py" benchmarks/gpu/gpu_check_deps.py missing "${image[@]}")
if [ ${#reqs[@]} -eq 0 ]; then
    echo "gpu_wheels: the image holds every runtime dependency; nothing to download"
    exit 0
fi
mkdir -p "$dest"
echo "gpu_wheels: downloading ${reqs[*]} into $dest"
"$py" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d "$dest" "${reqs[@]}"
"$py" benchmarks/gpu/gpu_check_deps.py check-wheels "$dest" "${image[@]}"
ls -l "$dest"/*.whl
du -sh "$dest"
