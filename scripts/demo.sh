#!/usr/bin/env bash
# The main job on a demo pipeline: starts Kafka (scripts/services.sh up kafka), builds the `ratchet` worker, then
#   produce 10,000 records to a new topic -> consume them -> write them exactly once to Parquet files
# through checkpoints, and print what was written. Extra arguments go to `ratchet demo` (see `ratchet demo --help`);
# run it again with `--topic <the topic> --records 0` and the same --out/--state to see it resume without
# writing anything twice.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/ratchet-target}
scripts/services.sh up kafka
eval "$(scripts/services.sh env)"
run=.ratchet/demo/$(date +%Y%m%d-%H%M%S)
cargo run --quiet --locked -p worker --bin ratchet -- demo --out "$run/out" --state "$run/checkpoints" "$@"
echo "output: $run/out   checkpoints: $run/checkpoints"
