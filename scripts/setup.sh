#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs the Debian 12 packages squall's build, tests and benchmarks need; does nothing when
# they are all present. Installing needs root (apt-get); run it as root, or install the listed
# packages yourself. The CUDA toolkit is optional and never installed here: when nvcc is on
# PATH (or under /usr/local/cuda) the CUDA targets are built, otherwise they are skipped.
set -euo pipefail

packages=(
  cmake ninja-build g++ make    # build
  doctest-dev                   # tests
  libopenmpi-dev openmpi-bin    # squall::mpi and the MPI oracle tests (the default MPI)
  libbenchmark-dev              # kernel benchmarks
  librandom123-dev              # Philox, the counter-based generator of the stochastic compressors
  clang libclang-rt-14-dev      # libFuzzer targets for the payload decoders
  clang-format                  # scripts/format.sh: the house style, checked by the test command
  libopenblas-dev zlib1g-dev    # examples/train_fashion_mnist: matrix products, gzip'd IDX files
  dataset-fashion-mnist         # its data (/usr/share/datasets/fashion-mnist)
  python3-mpi4py python3-numpy  # unmodified programs under libsquall_mpi.so (tests): mpi4py
  lammps lammps-examples        # and LAMMPS on its melt example
)
# The Python package and its tests (scripts/test.sh sets SQUALL_SETUP_PYTHON=1): the binding's
# pybind11 and headers, pytest, and torch (CPU) for the DDP hook; the main job needs none.
if [[ "${SQUALL_SETUP_PYTHON:-0}" == "1" ]]; then
  packages+=(pybind11-dev python3-dev python3-pytest python3-torch)
fi
# MPICH instead of / beside Open MPI: SQUALL_SETUP_MPICH=1 adds it (see README, "MPICH").
if [[ "${SQUALL_SETUP_MPICH:-0}" == "1" ]]; then
  packages+=(libmpich-dev mpich)
fi
# The training figures' plot (scripts/train.sh): SQUALL_SETUP_PLOT=1 adds matplotlib.
if [[ "${SQUALL_SETUP_PLOT:-0}" == "1" ]]; then
  packages+=(python3-matplotlib)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "setup: all packages present"
  exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
  echo "setup: missing Debian packages: ${missing[*]}" >&2
  echo "setup: run this script as root, or: sudo apt-get install ${missing[*]}" >&2
  exit 1
fi
if ! command -v apt-get >/dev/null; then
  echo "setup: apt-get not found: install ${missing[*]} by hand (squall targets Debian 12)" >&2
  exit 1
fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
