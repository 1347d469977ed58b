"""Change-data-capture fidelity peer: a PostgreSQL table with the column types CDC users have (numeric with and
without a scale, timestamptz, timestamp(3) and (6), date, time, uuid, jsonb, bytea, text[], a TOASTed text column
under the default REPLICA IDENTITY, a second unique index), a workload that exercises what replicas get wrong
(updates that leave the TOASTed column alone, primary-key changes, a delete and re-insert of a key in one
transaction, updates to NULL, a swap of unique values, a 5,000-row transaction), replica tables made with the
source's own DDL, and a value-by-value comparison of every replica with the source. No Ratchet code.

usage:
  cdc_fidelity.py create SOURCE_URL TABLE ROWS
  cdc_fidelity.py replicas PG_URL PG_TABLE MYSQL_URL MY_TABLE
  cdc_fidelity.py workload SOURCE_URL TABLE SEED OPS
  cdc_fidelity.py compare SOURCE_URL TABLE PG_URL PG_TABLE [MYSQL_URL MY_TABLE ICEBERG_URI WAREHOUSE ICEBERG_TABLE]

`create` makes TABLE (dropping an older one) and inserts ROWS rows (before the connector starts: its snapshot).
`workload` runs OPS random operations in transactions of 1 to 5, then every special case once; prints
{"transactions": n, "rows": rows after}. `compare` reads the source and each replica given (psycopg, pymysql,
Apache Iceberg's Java library for the Iceberg table kept by key) and prints {"source_rows": n, "<replica>":
{"rows": n, "mismatches": [{"id", "column", "source", "replica"}...]}} with the first 30 mismatches; values are
compared as Python's own types (Decimal, UTC datetime, date, time, UUID, bytes, parsed JSON).
"""

import datetime
import decimal
import json
import os
import random
import string
import sys
import uuid
from decimal import Decimal

UTC = datetime.timezone.utc

COLUMNS = {
    "id": "int", "amount": "decimal", "exact": "decimal", "ts": "instant", "ts3": "local", "ts6": "local",
    "day": "date", "clock": "time", "ref": "uuid", "doc": "json", "blob": "bytes", "tags": "list", "body": "text",
    "email": "text",
}

SOURCE_DDL = """CREATE TABLE {t} (id integer PRIMARY KEY, amount numeric(12, 2), exact numeric, ts timestamptz,
    ts3 timestamp(3), ts6 timestamp(6), day date, clock time, ref uuid, doc jsonb, blob bytea, tags text[],
    body text, email text UNIQUE)"""

MARIADB_DDL = """CREATE TABLE {t} (id INT PRIMARY KEY, amount DECIMAL(12, 2), exact DECIMAL(65, 30),
    ts DATETIME(6), ts3 DATETIME(3), ts6 DATETIME(6), day DATE, clock TIME(6),
    ref CHAR(36) CHARACTER SET ascii COLLATE ascii_bin, doc JSON, `blob` LONGBLOB, tags JSON,
    body LONGTEXT CHARACTER SET utf8mb4, email VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin UNIQUE)"""


def values(key: int, version: int) -> dict:
    """Row `key` at `version`: deterministic, some columns null, even keys with a 20 KB body PostgreSQL TOASTs."""
    sign = -1 if (key + version) % 3 == 1 else 1
    rnd = random.Random(f"{key}-{version}")
    body = None if version % 7 == 6 else (
        "".join(rnd.choice(string.ascii_letters + string.digits) for _ in range(20_000)) if key % 2 == 0
        else f"short body {key}.{version} ü")
    epoch = datetime.datetime(1970, 1, 1, tzinfo=UTC)
    micros = (key * 7_919_000_003 + version * 104_729_000_001) % (200 * 365 * 86_400_000_000) - 100 * 365 * 86_400_000_000
    instant = epoch + datetime.timedelta(microseconds=micros)
    return {
        "id": key,
        "amount": None if version % 5 == 4 else sign * Decimal(f"{(key * 31 + version * 7) % 10**10}.{(key + version) % 100:02d}"),
        "exact": sign * Decimal(f"{key}.{'7' * ((key + version) % 9)}") if version % 6 != 5 else None,
        "ts": instant,
        "ts3": (instant + datetime.timedelta(hours=key % 5)).replace(tzinfo=None, microsecond=(instant.microsecond // 1000) * 1000),
        "ts6": (instant - datetime.timedelta(days=key % 11)).replace(tzinfo=None),
        "day": datetime.date(1969, 1, 1) + datetime.timedelta(days=key * 13 + version),
        "clock": (datetime.datetime(2000, 1, 1) + datetime.timedelta(microseconds=(key * 123_456_789 + version) % 86_400_000_000)).time(),
        "ref": uuid.UUID(int=(key * 0x9E3779B97F4A7C15F39CC0605CEDC835 + version) % 2**128),
        "doc": {"key": key, "version": version, "price": str(Decimal(key) / 8), "tags": ["a", "ü"], "nested": {"ok": key % 2 == 0, "none": None}},
        "blob": bytes((key * version + j) % 256 for j in range((key + version) % 40)),
        "tags": None if version % 4 == 3 else [f"t{key}", f"ü{version}", ""][: (key + version) % 4],
        "body": body,
        "email": None if key % 10 == 9 else f"user{key}@example.test",
    }


def connect_pg(url: str):
    import psycopg
    from psycopg.types.json import set_json_loads

    conn = psycopg.connect(url)
    # jsonb as its text, parsed once by `normalize` like every other reader's: a JSON string holding a document's
    # text (a double-encoded value) then stays a string and differs from the document.
    set_json_loads(lambda s: s if isinstance(s, str) else bytes(s).decode(), conn)
    conn.execute("SET TIME ZONE 'UTC'")
    return conn


def insert(conn, table: str, row: dict) -> None:
    from psycopg.types.json import Jsonb

    names = list(COLUMNS)
    params = [Jsonb(row[n]) if n == "doc" and row[n] is not None else row[n] for n in names]
    conn.execute(f"INSERT INTO {table} ({', '.join(names)}) VALUES ({', '.join(['%s'] * len(names))})", params)


def create(url: str, table: str, rows: str) -> None:
    with connect_pg(url) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {table}")
        conn.execute(SOURCE_DDL.format(t=table))
        for key in range(int(rows)):
            insert(conn, table, values(key, 0))
    print(json.dumps({"rows": int(rows)}))


def replicas(pg_url: str, pg_table: str, mysql_url: str, my_table: str) -> None:
    with connect_pg(pg_url) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {pg_table}")
        conn.execute(SOURCE_DDL.format(t=pg_table))
    conn = connect_mysql(mysql_url)
    try:
        with conn.cursor() as cur:
            cur.execute(f"DROP TABLE IF EXISTS `{my_table}`")
            cur.execute(MARIADB_DDL.format(t=my_table))
    finally:
        conn.close()
    print(json.dumps({"created": [pg_table, my_table]}))


def workload(url: str, table: str, seed: str, ops: str) -> None:
    rnd = random.Random(int(seed))
    transactions = 0
    with connect_pg(url) as conn:
        keys = [r[0] for r in conn.execute(f"SELECT id FROM {table}").fetchall()]
        versions = {k: 0 for k in keys}
        next_key = max(keys, default=0) + 1000
        done = 0
        while done < int(ops):
            with conn.transaction():
                for _ in range(rnd.randint(1, 5)):
                    done += 1
                    choice = rnd.random()
                    if choice < 0.35 or not keys:
                        key, next_key = next_key, next_key + 1
                        keys.append(key)
                        versions[key] = 0
                        insert(conn, table, values(key, 0))
                        continue
                    key = rnd.choice(keys)
                    versions[key] += 1
                    row = values(key, versions[key])
                    if choice < 0.55:
                        # Leaves the body alone: under REPLICA IDENTITY DEFAULT a TOASTed body is not sent.
                        from psycopg.types.json import Jsonb

                        conn.execute(f"UPDATE {table} SET amount = %s, ts = %s, clock = %s, doc = %s WHERE id = %s",
                                     (row["amount"], row["ts"], row["clock"], Jsonb(row["doc"]), key))
                    elif choice < 0.65:
                        conn.execute(f"UPDATE {table} SET amount = NULL, exact = NULL, tags = NULL, blob = NULL, "
                                     f"ref = NULL WHERE id = %s", (key,))
                    elif choice < 0.72:
                        conn.execute(f"UPDATE {table} SET body = %s, tags = %s WHERE id = %s",
                                     (row["body"], row["tags"], key))
                    elif choice < 0.85:
                        conn.execute(f"DELETE FROM {table} WHERE id = %s", (key,))
                        keys.remove(key)
                    elif choice < 0.93 and key % 2 == 1:
                        # A primary-key change: Debezium sends the old key's delete and the new key's insert; the
                        # email (unique) moves with it. Only of rows whose body is not TOASTed: under REPLICA
                        # IDENTITY DEFAULT the new key's insert would not carry a TOASTed body, which no replica can
                        # then know (Ratchet refuses such a change; docs/worker.md, "Change data capture").
                        new, next_key = next_key, next_key + 1
                        conn.execute(f"UPDATE {table} SET id = %s WHERE id = %s", (new, key))
                        keys.remove(key)
                        keys.append(new)
                        versions[new] = versions[key]
                    elif choice >= 0.93:
                        # A delete and a re-insert of the key in one transaction.
                        conn.execute(f"DELETE FROM {table} WHERE id = %s", (key,))
                        insert(conn, table, row)
            transactions += 1
        # A swap of two unique emails, in one transaction (the replica must apply it in order).
        with_email = [r[0] for r in conn.execute(
            f"SELECT id FROM {table} WHERE email IS NOT NULL ORDER BY id LIMIT 2").fetchall()]
        if len(with_email) == 2:
            a, b = with_email
            with conn.transaction():
                ea = conn.execute(f"SELECT email FROM {table} WHERE id = %s", (a,)).fetchone()[0]
                eb = conn.execute(f"SELECT email FROM {table} WHERE id = %s", (b,)).fetchone()[0]
                conn.execute(f"UPDATE {table} SET email = NULL WHERE id = %s", (a,))
                conn.execute(f"UPDATE {table} SET email = %s WHERE id = %s", (ea, b))
                conn.execute(f"UPDATE {table} SET email = %s WHERE id = %s", (eb, a))
            transactions += 1
        # One transaction of 5,000 rows.
        with conn.transaction():
            with conn.cursor() as cur:
                with cur.copy(f"COPY {table} (id, amount, exact, ts, ts3, ts6, day, clock, ref, body, email) "
                              "FROM STDIN") as copy:
                    for i in range(5000):
                        key = next_key + i
                        row = values(key, 1)
                        copy.write_row((key, row["amount"], row["exact"], row["ts"], row["ts3"], row["ts6"],
                                        row["day"], row["clock"], row["ref"], f"bulk {key}", f"bulk{key}@example.test"))
        transactions += 1
        count = conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    print(json.dumps({"transactions": transactions, "rows": count}))


def connect_mysql(url: str):
    import pymysql
    from urllib.parse import unquote, urlparse

    parsed = urlparse(url)
    return pymysql.connect(host=parsed.hostname, port=parsed.port or 3306, user=unquote(parsed.username or ""),
                           password=unquote(parsed.password or ""), database=parsed.path.lstrip("/"),
                           autocommit=True, charset="utf8mb4", init_command="SET time_zone = '+00:00'")


def normalize(kind: str, v):
    if v is None:
        return None
    if kind == "int":
        return int(v)
    if kind == "decimal":
        return Decimal(str(v)).normalize() if not isinstance(v, Decimal) else v.normalize()
    if kind == "instant":
        if isinstance(v, datetime.datetime):
            return v.astimezone(UTC) if v.tzinfo else v.replace(tzinfo=UTC)
        return datetime.datetime.fromisoformat(v).astimezone(UTC)
    if kind == "local":
        return v.replace(tzinfo=None) if isinstance(v, datetime.datetime) else datetime.datetime.fromisoformat(v)
    if kind == "date":
        return v if isinstance(v, datetime.date) else datetime.date.fromisoformat(v)
    if kind == "time":
        if isinstance(v, datetime.time):
            return v
        if isinstance(v, datetime.timedelta):
            return (datetime.datetime(2000, 1, 1) + v).time()
        return datetime.time.fromisoformat(v)
    if kind == "uuid":
        return v if isinstance(v, uuid.UUID) else uuid.UUID(str(v))
    if kind == "json":
        return json.loads(v, parse_float=Decimal) if isinstance(v, str) else v
    if kind == "bytes":
        if isinstance(v, (bytes, bytearray, memoryview)):
            return bytes(v)
        import base64

        return base64.b64decode(v.removeprefix("base64:"))
    if kind == "list":
        return json.loads(v) if isinstance(v, str) else list(v)
    return v


def table_rows(rows: list) -> dict:
    return {int(r["id"]): {c: normalize(k, r.get(c)) for c, k in COLUMNS.items()} for r in rows}


def read_pg(url: str, table: str) -> list:
    with connect_pg(url) as conn:
        cur = conn.execute(f"SELECT * FROM {table}")
        names = [d.name for d in cur.description]
        return [dict(zip(names, r)) for r in cur.fetchall()]


def read_mysql(url: str, table: str) -> list:
    conn = connect_mysql(url)
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT * FROM `{table}`")
            names = [d[0] for d in cur.description]
            return [dict(zip(names, r)) for r in cur.fetchall()]
    finally:
        conn.close()


def read_iceberg(uri: str, warehouse: str, table_name: str) -> list:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import iceberg_table
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.exceptions import NoSuchTableError

    catalog = SqlCatalog("ratchet", uri=uri, warehouse=warehouse, **iceberg_table.s3_props())
    try:
        table = iceberg_table.load_table(catalog, table_name)
    except NoSuchTableError:
        return []
    if table.metadata.current_snapshot_id is None:
        return []
    read = iceberg_table.java_read(table.metadata_location)
    return [dict(zip(read["column_names"], values)) for values in read["rows"]]


def differences(source: dict, replica: dict) -> list:
    out = []
    for key in sorted(set(source) | set(replica)):
        want, have = source.get(key), replica.get(key)
        if want is None or have is None:
            out.append({"id": key, "column": "row", "source": want is not None, "replica": have is not None})
            continue
        for column in COLUMNS:
            if want[column] != have[column]:
                out.append({"id": key, "column": column, "source": repr(want[column])[:200],
                            "replica": repr(have[column])[:200]})
    return out


def compare(source_url: str, table: str, pg_url: str, pg_table: str, *rest: str) -> None:
    source = table_rows(read_pg(source_url, table))
    out = {"source_rows": len(source)}
    replicas = [("pg", lambda: read_pg(pg_url, pg_table))]
    if rest:
        mysql_url, my_table, uri, warehouse, iceberg_table_name = rest
        replicas += [("mysql", lambda: read_mysql(mysql_url, my_table)),
                     ("iceberg", lambda: read_iceberg(uri, warehouse, iceberg_table_name))]
    for name, read in replicas:
        rows = table_rows(read())
        found = differences(source, rows)
        out[name] = {"rows": len(rows), "mismatches": found[:30], "mismatch_count": len(found)}
    print(json.dumps(out, default=str))


def main() -> None:
    command, *args = sys.argv[1:]
    {"create": create, "replicas": replicas, "workload": workload, "compare": compare}[command](*args)


if __name__ == "__main__":
    decimal.getcontext().prec = 100
    main()
    sys.stdout.flush()
    os._exit(0)
