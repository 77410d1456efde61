#!/usr/bin/env bash
# Configures and builds spark for the H100 (sm_90a only: fast) in build-dev.
set -eo pipefail
source scripts/device/setup.sh
cmake -S . -B build-dev -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPARK_CUDA=ON -DSPARK_CUDA_ARCHS=90a > /dev/null
ninja -C build-dev -j16 "$@"
