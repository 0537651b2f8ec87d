#!/usr/bin/env bash
# Downloads the wheels the GPU machine lacks into .whl/ (ignored by git; carried with the run):
# everything else jaxgen imports is in the device image (KINDS.md's package list), and so are
# these wheels' own dependencies. llguidance 1.9.1 is built for glibc 2.31 or newer (the
# device's Python 3.12.3 image has newer). Run from the repository root on a machine with pip access:
#
#   bash benchmarks/gpu/fetch_wheels.sh
#
#   llguidance  jaxgen.engine's constrained decoding (imported by every engine)
#   gguf        GGUF loading (jaxgen.loaders, imported when a .gguf path is given)
#   starlette   the server (serving/)
#   uvicorn     the server (serving/)
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
PYTHON=${PYTHON:-python3}
WHEELS=(llguidance==1.9.1 gguf==0.19.0 starlette==1.10.0 uvicorn==0.54.0)
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >> "$exclude"
mkdir -p .whl
"$PYTHON" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_35_x86_64 --platform manylinux_2_34_x86_64 \
  --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  -d .whl "${WHEELS[@]}"
du -ch .whl/*.whl | tail -n 1
