#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The test command: installs what is missing, builds everything (preset "default"), runs every
# test with ctest, then builds and runs the unit tests and the shared-memory transport's
# multi-process tests under AddressSanitizer and UndefinedBehaviorSanitizer (preset "asan").
# .ci/run calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
source scripts/cuda-path.sh

jobs=$(nproc)
echo "== build (preset default)"
cmake --preset default >/dev/null
cmake --build --preset default -j "$jobs"
echo "== tests (preset default)"
ctest --preset default -j "$jobs"

echo "== unit and shared-memory tests under ASan + UBSan (preset asan)"
cmake --preset asan >/dev/null
cmake --build --preset asan -j "$jobs" --target squall_unit_tests squall_compress_tests squall_shm_tests
ctest --preset asan -j "$jobs"

# doctest's own counts, summed over every doctest run of both presets.
for preset in default asan; do
  log="build/$preset/Testing/Temporary/LastTest.log"
  sed 's/\x1b\[[0-9;]*m//g' "$log" | awk -v p="$preset" '
    /\[doctest\] test cases:/ { cases += $4 }
    /\[doctest\] assertions:/ { asserts += $3 }
    END { printf "doctest (%s): %d test cases, %d assertions, all passed\n", p, cases, asserts }'
done
