#!/usr/bin/env bash
# The whole test suite, on a fresh machine or a warm one:
#   1. scripts/services.sh up   (installs and starts Kafka, PostgreSQL, MariaDB, SeaweedFS, Toxiproxy, the verifiers)
#   2. cargo fmt --check, cargo clippy --workspace --all-targets -D warnings, no import cycles between modules
#   3. cargo test --workspace   (unit tests, and acceptance tests against the real services)
#   4. the service self-checks (pytest selfcheck/: the Kafka broker's transaction behaviour)
# then a summary. Exit status is non-zero when any step failed.
#
# Environment: CARGO_TARGET_DIR (default ~/.cache/ratchet-target, outside the clone so builds are reused),
# RATCHET_SKIP_LINT=1 skips step 2, extra arguments go to `cargo test` (e.g. scripts/test.sh -p file-sink).
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/ratchet-target}
LOG_DIR=${RATCHET_TEST_LOGS:-$CARGO_TARGET_DIR/ratchet-test-logs}
mkdir -p "$LOG_DIR"

declare -a names results times
failed=0

# step NAME CMD...: run CMD, tee its output to $LOG_DIR/NAME.log, record the outcome and duration.
step() {
  local name=$1; shift
  local start=$SECONDS rc
  printf '\n==> %s: %s\n' "$name" "$*"
  "$@" 2>&1 | tee "$LOG_DIR/$name.log"
  rc=${PIPESTATUS[0]}
  names+=("$name"); times+=($((SECONDS - start)))
  if ((rc == 0)); then results+=(ok); else results+=("FAILED (exit $rc)"); failed=1; fi
  return "$rc"
}

step services scripts/services.sh up || { echo "services did not come up: nothing else can run" >&2; exit 1; }
eval "$(scripts/services.sh env)"

if [[ ${RATCHET_SKIP_LINT:-} != 1 ]]; then
  step fmt cargo fmt --all --check
  step clippy cargo clippy --workspace --all-targets --locked -- -D warnings
  step cycles "$RATCHET_PYTHON" scripts/check-module-cycles.py
fi
# Arguments select what to test (`-p file-sink`, a test name filter); without them, the whole workspace.
if (($#)); then
  step cargo-test cargo test --locked "$@"
else
  step cargo-test cargo test --workspace --locked
fi
step selfcheck "$RATCHET_PYTHON" -m pytest -p no:cacheprovider -q selfcheck

# Count tests from the runners' own summary lines.
passed=0 failures=0
while read -r p f; do passed=$((passed + p)); failures=$((failures + f)); done < <(
  sed -n 's/^test result: [a-zA-Z]*\. \([0-9]*\) passed; \([0-9]*\) failed.*/\1 \2/p' "$LOG_DIR/cargo-test.log" 2>/dev/null)
py=$(tail -n 3 "$LOG_DIR/selfcheck.log" 2>/dev/null | grep -Eo '[0-9]+ passed' | grep -Eo '[0-9]+' || echo 0)
pyf=$(tail -n 3 "$LOG_DIR/selfcheck.log" 2>/dev/null | grep -Eo '[0-9]+ failed' | grep -Eo '[0-9]+' || echo 0)
passed=$((passed + py)); failures=$((failures + pyf))

printf '\n==> summary (logs in %s)\n' "$LOG_DIR"
for i in "${!names[@]}"; do printf '  %-12s %-18s %5ss\n' "${names[i]}" "${results[i]}" "${times[i]}"; done
if ((failed)) && ((failures == 0)); then failures=1; fi
echo "tests: $passed passed, $failures failed"
exit "$failed"
