"""Independent verifier: the values of one column across the visible Parquet files of a directory, as JSON.

usage: parquet_ids.py DIR COLUMN

Reads every visible (not dot-prefixed) *.parquet file with pyarrow; prints {"ids": [...]} with one entry per row
(duplicates kept) and {"ids": []} when DIR does not exist yet.
"""

import json
import sys
from pathlib import Path

import pyarrow.parquet as pq


def main(directory: str, column: str) -> None:
    root = Path(directory)
    ids = []
    if root.exists():
        for path in sorted(root.iterdir()):
            if path.suffix == ".parquet" and not path.name.startswith("."):
                ids.extend(pq.read_table(path, columns=[column]).column(column).to_pylist())
    json.dump({"ids": ids}, sys.stdout)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    main(sys.argv[1], sys.argv[2])
