#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds the named targets in the release preset (-O3, tests off), as bench.sh and train.sh
# need them. Warnings are shown, not fatal: a user's build must not stop on a new compiler's
# warning. SQUALL_WARNINGS_AS_ERRORS=ON makes them errors (scripts/test.sh sets it, so the
# code stays warning-free at -O3).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/cuda-path.sh
cmake --preset release -DSQUALL_BUILD_TESTS=OFF \
  -DCMAKE_COMPILE_WARNING_AS_ERROR="${SQUALL_WARNINGS_AS_ERRORS:-OFF}" >/dev/null
cmake --build --preset release -j "$(nproc)" --target "$@"
