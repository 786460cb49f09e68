#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The test command: installs what is missing, checks the formatting of every source
# (scripts/format.sh --check, .clang-format), builds squall-bench and the training example in
# the release preset (-O3, warnings as errors; the ci tests run these two), then everything
# else with warnings as errors (preset "ci": the default preset plus -Werror, no
# debug info, the libraries at -O0), runs its tests with ctest but for those the asan preset
# runs (below), then builds with clang++ and runs the unit tests and the shared-memory
# transport's multi-process tests under AddressSanitizer and UndefinedBehaviorSanitizer
# (preset "asan"), and last runs the README's
# other commands as a user would, in short form: the main job (scripts/bench.sh) at 2 ranks,
# 4 KiB to 1 MiB, and scripts/train.sh for one short epoch, both built in the release preset
# (-O3) with warnings as errors. .ci/run calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
SQUALL_SETUP_PYTHON=1 ./scripts/setup.sh
source scripts/cuda-path.sh
# Each phase says how long it took (seconds since the last mark), so the test command's time
# can be read phase by phase.
mark=$SECONDS
took() {
  echo "== $1 took $((SECONDS - mark)) s"
  mark=$SECONDS
}
took "setup"

echo "== formatting (scripts/format.sh --check)"
./scripts/format.sh --check

jobs=$(nproc)
took "formatting"
# squall-bench and the training example in the release preset first (-O3, warnings as
# errors): the main job and the training script below run them, and the ci preset's tests run
# these binaries instead of compiling the two a second time (about 340 s of compiler time).
# One after the other, not side by side: run together (two jobs each, four compilers on two
# cores) the two builds took 933 s, where the ci build alone had taken 543 s within the hour
# and the release build takes 250-280 s.
echo "== squall-bench and train_fashion_mnist (release preset)"
SQUALL_WARNINGS_AS_ERRORS=ON ./scripts/build-release.sh squall_bench train_fashion_mnist
reuse=(-DSQUALL_BENCH_EXECUTABLE="$PWD/build/release/bench/squall-bench"
       -DSQUALL_TRAIN_EXECUTABLE="$PWD/build/release/examples/train_fashion_mnist")
took "build (preset release: squall-bench, train_fashion_mnist)"
echo "== build (preset ci)"
cmake --preset ci "${reuse[@]}" >/dev/null
cmake --build --preset ci -j "$jobs"
took "build (preset ci) on $jobs jobs"
# The tests the asan preset runs below (its filter: labels unit and shm, not static, large or
# soak) run there only, under the sanitizers, at the optimisation they have here (-O0, the heavy
# sources -O1), built by clang++ where here g++ builds them: a second compiler, where running
# them here again would only repeat them. Those labelled "asan_partial" run here too: they have
# test cases the asan build leaves out (tests/CMakeLists.txt says which).
cmake --preset asan >/dev/null
names() { awk '/Test +#[0-9]+:/ {print $3}' | sort; }
asan_only=$(comm -23 <(ctest --preset asan -N | names) <(ctest --preset ci -N -L asan_partial | names))
skip=()
if [ -n "$asan_only" ]; then
  skip=(-E "^($(sed 's/\./\\./g' <<<"$asan_only" | paste -sd '|'))\$")
fi
echo "== tests (preset ci), but for the $(wc -l <<<"$asan_only") the asan preset runs"
ctest --preset ci -j "$jobs" "${skip[@]}"
took "tests (preset ci)"

echo "== unit and shared-memory tests under ASan + UBSan (preset asan)"
cmake --build --preset asan -j "$jobs" --target squall_unit_tests squall_compress_tests squall_shm_tests
took "build (preset asan)"
ctest --preset asan -j "$jobs"
took "tests (preset asan)"

# The README's main command and the training script, short, so that neither breaks unnoticed.
echo "== the main job, short: scripts/bench.sh -n 2 -b 4K -e 1M (release preset)"
SQUALL_WARNINGS_AS_ERRORS=ON ./scripts/bench.sh -n 2 -b 4K -e 1M
took "the main job, short (build and run)"
echo "== the training script, short: scripts/train.sh at 2 ranks, one epoch of 6,000 images"
SQUALL_WARNINGS_AS_ERRORS=ON OUT=build/ci-train ./scripts/train.sh -n 2 --epochs 1 \
  --train-subset 6000 --test-subset 1000 -c none,topk:0.01+ef --require-accuracy 0.6
took "the training script, short (build and run)"

# doctest's own counts, summed over every doctest run of both presets.
for preset in ci asan; do
  log="build/$preset/Testing/Temporary/LastTest.log"
  sed 's/\x1b\[[0-9;]*m//g' "$log" | awk -v p="$preset" '
    /\[doctest\] test cases:/ { cases += $4 }
    /\[doctest\] assertions:/ { asserts += $3 }
    END { printf "doctest (%s): %d test cases, %d assertions, all passed\n", p, cases, asserts }'
done
