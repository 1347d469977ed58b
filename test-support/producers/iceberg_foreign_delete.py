"""A foreign writer of an Iceberg table: deletes the rows whose ID_COLUMN equals VALUE with pyiceberg's own
copy-on-write delete, which rewrites every data file holding such a row into a new file without it (the file's
other rows move to new positions of a new file: what a compaction or a Spark copy-on-write DELETE does to rows a
writer located by position).

usage: iceberg_foreign_delete.py CATALOG_NAME CATALOG_URI WAREHOUSE TABLE ID_COLUMN VALUE

Prints {"snapshot_id": the snapshot it committed, "summary": its summary}.
"""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "verifiers"))

from iceberg_table import open_catalog  # noqa: E402


def main(name: str, uri: str, warehouse: str, table_name: str, id_column: str, value: str) -> None:
    from pyiceberg.expressions import EqualTo

    table = open_catalog(name, uri, warehouse).load_table(table_name)
    table.delete(EqualTo(id_column, int(value)))
    snapshot = table.current_snapshot()
    json.dump({"snapshot_id": snapshot.snapshot_id, "summary": snapshot.summary.additional_properties}, sys.stdout)


if __name__ == "__main__":
    if len(sys.argv) != 7:
        raise SystemExit(__doc__)
    main(*sys.argv[1:])
    sys.stdout.flush()
    os._exit(0)
