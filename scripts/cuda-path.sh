# SPDX-License-Identifier: Apache-2.0
# Sourced by the scripts: puts the CUDA toolkit's nvcc on PATH where it is installed in the
# usual place but not on PATH, so that CMake finds it. No-op otherwise.
if ! command -v nvcc >/dev/null 2>&1 && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
