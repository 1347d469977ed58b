"""How long pyiceberg takes to plan a scan of a table (the small-files benchmark's reader-side cost).

usage: pyiceberg_plan.py CATALOG_URI WAREHOUSE TABLE

Loads TABLE from the SQL catalog named "ratchet" and prints {"plan_seconds": s, "data_files": n, "manifests": m}:
the wall time of `table.scan().plan_files()` (reading the current snapshot's manifest list and every manifest it
names), the data files it planned, and the manifests the current snapshot names.
"""

import json
import sys
import time

from pyiceberg.catalog.sql import SqlCatalog


def main(uri: str, warehouse: str, table_name: str) -> None:
    table = SqlCatalog("ratchet", uri=uri, warehouse=warehouse).load_table(table_name)
    started = time.perf_counter()
    tasks = list(table.scan().plan_files())
    seconds = time.perf_counter() - started
    current = table.current_snapshot()
    manifests = len(current.manifests(table.io)) if current else 0
    json.dump({"plan_seconds": seconds, "data_files": len(tasks), "manifests": manifests}, sys.stdout)


if __name__ == "__main__":
    main(*sys.argv[1:])
