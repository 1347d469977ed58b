"""Independent verifier: what a reader of a directory of Parquet files sees, as JSON.

usage: parquet_dir.py DIR KEY_COLUMN...

Reads every visible (not dot-prefixed) *.parquet file with pyarrow. Prints {"rows": n, "distinct": number of
distinct KEY_COLUMN tuples, "files": [names], "hidden": [dot-prefixed names left in DIR]}.
"""

import json
import os
import sys
from pathlib import Path

import pyarrow.parquet as pq


def main(directory: str, keys: list[str]) -> None:
    root = Path(directory)
    rows = 0
    distinct = set()
    files = sorted(p.name for p in root.iterdir() if p.suffix == ".parquet" and not p.name.startswith("."))
    for name in files:
        table = pq.read_table(root / name)
        rows += table.num_rows
        distinct.update(zip(*(table.column(k).to_pylist() for k in keys)))
    hidden = sorted(p.name for p in root.iterdir() if p.name.startswith("."))
    json.dump({"rows": rows, "distinct": len(distinct), "files": files, "hidden": hidden}, sys.stdout)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    main(sys.argv[1], sys.argv[2:])
    # pyarrow's thread pools can abort the interpreter at shutdown ("terminate called without an active
    # exception", about 1 run in 40 here); the result is complete and flushed, so leave without that teardown.
    sys.stdout.flush()
    os._exit(0)
