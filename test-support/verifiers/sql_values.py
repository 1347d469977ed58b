"""Independent verifier of values: every committed row of a PostgreSQL or MariaDB table, each value rendered
exactly as the database's own client library returns it, so a test compares value by value (no rounding):

  decimal -> its exact text in plain notation ("12.3400", "-0.0000000001"), as psycopg/pymysql read it
  date / time / datetime -> ISO 8601 (`isoformat()`, every fractional digit the value has)
  bytes -> "base64:<base64>"
  uuid -> canonical text
  json / jsonb -> {"json": the document} (PostgreSQL); MariaDB's JSON columns are text: their text
  float -> repr (the shortest text that reads back as the same double)
  arrays -> lists of the above
  everything else -> as JSON has it (int, str, bool, null)

usage: sql_values.py pg URL TABLE KEY         (psycopg; URL as libpq takes it)
       sql_values.py mysql URL TABLE KEY      (pymysql; mysql://user:password@host:port/db)

Prints {"columns": [name, ...], "types": {name: the database's type}, "rows": [{name: value}, ...]} ordered by
KEY (the table's every column).
"""

import base64
import datetime
import decimal
import json
import sys
import uuid
from urllib.parse import unquote, urlparse


def render(value):
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return {"float": repr(value)}
    if isinstance(value, decimal.Decimal):
        return format(value, "f")
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return {"interval_us": value // datetime.timedelta(microseconds=1)}
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "base64:" + base64.b64encode(bytes(value)).decode()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [render(v) for v in value]
    if isinstance(value, dict):
        return {"json": value}
    return {"repr": repr(value)}


def postgres(url: str, table: str, key: str):
    import psycopg
    from psycopg import sql

    with psycopg.connect(url, autocommit=True) as conn:
        types = dict(conn.execute(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
            "WHERE attrelid = to_regclass(%s) AND attnum > 0 AND NOT attisdropped",
            (table,),
        ).fetchall())
        conn.execute("SET TIME ZONE 'UTC'")
        cur = conn.execute(sql.SQL("SELECT * FROM {} ORDER BY {}").format(
            sql.Identifier(*table.split(".")), sql.Identifier(key)))
        names = [d.name for d in cur.description]
        rows = []
        for row in cur.fetchall():
            out = {}
            for name, value in zip(names, row):
                is_json = types.get(name, "").startswith("json")
                out[name] = {"json": value} if is_json and value is not None else render(value)
            rows.append(out)
        return names, types, rows


def mysql(url: str, table: str, key: str):
    import pymysql

    parsed = urlparse(url)
    conn = pymysql.connect(
        host=parsed.hostname,
        port=parsed.port or 3306,
        user=unquote(parsed.username or ""),
        password=unquote(parsed.password or ""),
        database=parsed.path.lstrip("/"),
        autocommit=True,
        charset="utf8mb4",
        init_command="SET time_zone = '+00:00'",
    )
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT COLUMN_NAME, COLUMN_TYPE, DATA_TYPE FROM information_schema.COLUMNS "
                "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s", (table,))
            types = {name: column_type for name, column_type, _ in cur.fetchall()}
            cur.execute(f"SELECT * FROM `{table}` ORDER BY `{key}`")
            names = [d[0] for d in cur.description]
            rows = [{name: render(value) for name, value in zip(names, row)} for row in cur.fetchall()]
            return names, types, rows
    finally:
        conn.close()


def main() -> None:
    kind, url, table, key = sys.argv[1:5]
    names, types, rows = {"pg": postgres, "mysql": mysql}[kind](url, table, key)
    print(json.dumps({"columns": names, "types": types, "rows": rows}))


if __name__ == "__main__":
    main()
