#!/usr/bin/env bash
# The main job on a demo pipeline: starts Kafka and PostgreSQL (scripts/services.sh), builds the `ratchet` worker,
# then `ratchet demo`: a generator produces 20,000 orders to a new topic while `ratchet run` writes them exactly
# once to Parquet files, an Iceberg table (SQLite catalog), a PostgreSQL table and a Kafka topic; the worker is
# killed with SIGKILL mid-run and restarted, and every sink is read back and compared with the input.
# Extra arguments go to `ratchet demo` (see `ratchet demo --help`).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/ratchet-target}
scripts/services.sh up kafka postgres
eval "$(scripts/services.sh env)"
cargo run --quiet --locked -p worker --bin ratchet -- demo "$@"
