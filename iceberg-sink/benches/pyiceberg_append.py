"""The peer of the Iceberg sink benchmark: pyiceberg `append` of the same rows, one snapshot per append.

usage: pyiceberg_append.py CATALOG_URI WAREHOUSE TABLE ROWS_PER_APPEND SECONDS

Creates TABLE (id long, payload string) in a SQL catalog, appends Arrow tables of ROWS_PER_APPEND rows (the same
rows as the Rust benchmark) for SECONDS, and prints {"rows": n, "seconds": s, "appends": k,
"append_p50_ms": .., "append_p99_ms": ..}.
"""

import json
import os
import sys
import time

import pyarrow as pa
from pyiceberg.catalog.sql import SqlCatalog


MASK = (1 << 64) - 1


def digest(seed: int) -> int:
    x = ((seed * 0x9E3779B97F4A7C15) & MASK) ^ 0xD1B54A32D192ED03
    x ^= x >> 31
    x = (x * 0xBF58476D1CE4E5B9) & MASK
    return x ^ (x >> 29)


def payload(i: int) -> str:
    hexes = "".join(f"{digest(i + k):016x}" for k in range(4))
    return f"order {i} customer {i % 99991} {hexes}"


def batch(start: int, rows: int) -> pa.Table:
    ids = pa.array(range(start, start + rows), type=pa.int64())
    payload_column = pa.array([payload(i) for i in range(start, start + rows)])
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("payload", pa.string(), nullable=False)])
    return pa.Table.from_arrays([ids, payload_column], schema=schema)


def main(uri: str, warehouse: str, table_name: str, rows: int, seconds: float) -> None:
    catalog = SqlCatalog("bench", uri=uri, warehouse=warehouse)
    namespace = table_name.split(".")[0]
    catalog.create_namespace_if_not_exists(namespace)
    first = batch(0, rows)
    table = catalog.create_table_if_not_exists(table_name, schema=first.schema)
    # Built before the clock starts (1M distinct rows, like the Rust side's): only the append is timed.
    data = [first] + [batch(i * rows, rows) for i in range(1, 10)]
    latencies = []
    written = 0
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        t0 = time.monotonic()
        table.append(data[len(latencies) % len(data)])
        latencies.append(time.monotonic() - t0)
        written += rows
    elapsed = time.monotonic() - start
    latencies.sort()
    pick = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000
    json.dump(
        {
            "rows": written,
            "seconds": elapsed,
            "appends": len(latencies),
            "append_p50_ms": pick(0.5),
            "append_p99_ms": pick(0.99),
        },
        sys.stdout,
    )


if __name__ == "__main__":
    if len(sys.argv) != 6:
        raise SystemExit(__doc__)
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]))
    sys.stdout.flush()
    os._exit(0)
