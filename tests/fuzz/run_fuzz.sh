#!/usr/bin/env bash
# Runs one libFuzzer target for a bounded time from its seed corpus (ctest -L fuzz).
# The seed corpus in the checkout is only read: libFuzzer writes the inputs it finds into a
# fresh working corpus, and a crashing input into WORK/, whose path it prints. Exit 0 when
# the time ran out with no finding; libFuzzer's non-zero status on a crash, leak, timeout or
# out-of-memory.
# Usage: run_fuzz.sh TARGET_BINARY SEED_CORPUS WORK [LIBFUZZER_FLAG...]
#   Each target runs $GPURUN_FUZZ_SECONDS seconds, else 20. Fuzzing longer by hand:
#   GPURUN_FUZZ_SECONDS=600 ctest -L fuzz, or run the binary itself (docs/architecture.md,
#   "Fuzzing").
set -euo pipefail
binary=$1 seeds=$2 work=$3
shift 3
seconds=${GPURUN_FUZZ_SECONDS:-20}
rm -rf "$work"
mkdir -p "$work/corpus"
# -timeout: an input that takes longer is a hang; -rss_limit_mb: one that needs more memory
# is a finding too (a size field that is believed).
set +e
"$binary" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
  -artifact_prefix="$work/" "$@" "$work/corpus" "$seeds" 2>"$work/fuzz.log"
status=$?
set -e
grep -E "^(#[0-9]+[[:space:]]+DONE|stat::number_of_executed_units|stat::peak_rss_mb|stat::new_units_added)" \
  "$work/fuzz.log" || true
if [ "$status" -ne 0 ]; then
  tail -n 60 "$work/fuzz.log"
  echo "run_fuzz: $(basename "$binary") found an input gpurun does not handle (exit $status):"
  ls "$work"/crash-* "$work"/leak-* "$work"/timeout-* "$work"/oom-* 2>/dev/null || true
  echo "run_fuzz: reproduce with: $binary INPUT; fix it, then add INPUT to $seeds"
fi
exit "$status"
