#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Formats every C++ and CUDA source of the tree with .clang-format (clang-format 14, Debian 12's).
#   scripts/format.sh          rewrites the files in place
#   scripts/format.sh --check  changes nothing; lists each file that differs and exits 1
# The test command (scripts/test.sh) runs the check first: a formatting difference fails it.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=fix
case "${1:-}" in
  "") ;;
  --check) mode=check ;;
  *) echo "usage: scripts/format.sh [--check]" >&2; exit 2 ;;
esac
if ! command -v clang-format >/dev/null; then
  echo "format: clang-format not found (scripts/setup.sh installs it)" >&2
  exit 2
fi
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files -- '*.hpp' '*.cpp' '*.cuh' '*.cu' '*.h' '*.c')
else
  mapfile -t files < <(find include tests bench examples fuzz tools -type f \
    \( -name '*.hpp' -o -name '*.cpp' -o -name '*.cuh' -o -name '*.cu' -o -name '*.h' -o -name '*.c' \) 2>/dev/null | sort)
fi
if [[ $mode == fix ]]; then
  clang-format -i "${files[@]}"
  exit 0
fi
differ=()
for f in "${files[@]}"; do
  [[ -f $f ]] || continue
  if ! clang-format --dry-run -Werror "$f" >/dev/null 2>&1; then differ+=("$f"); fi
done
if [[ ${#differ[@]} -gt 0 ]]; then
  echo "format: ${#differ[@]} of ${#files[@]} files differ from .clang-format (run scripts/format.sh):" >&2
  printf '  %s\n' "${differ[@]}" >&2
  exit 1
fi
echo "format: ${#files[@]} files match .clang-format"
