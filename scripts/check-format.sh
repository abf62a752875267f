#!/usr/bin/env bash
# Fails when a C++ file of ours is not formatted as .clang-format says (clang-format's own
# --dry-run --Werror), naming the files. Usage: scripts/check-format.sh [FILE...]
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -eq 0 ]; then
  mapfile -t files < <(git ls-files '*.cpp' '*.h')
else
  files=("$@")
fi
if ! clang-format --dry-run --Werror "${files[@]}" 2>/tmp/gpurun-format.$$; then
  grep -o '^[^:]*:' /tmp/gpurun-format.$$ | sort -u | sed 's/:$//;s/^/not formatted: /' >&2
  rm -f /tmp/gpurun-format.$$
  echo "run: clang-format -i FILE..." >&2
  exit 1
fi
rm -f /tmp/gpurun-format.$$
echo "check-format: ${#files[@]} files formatted"
