"""Independent verifier: every committed row of a PostgreSQL or MariaDB table, as JSON, values canonical so two
databases' rows compare equal (booleans and integers as integers, floats rounded to 9 significant digits, text as
text, NULL as null).

usage: sql_rows.py pg URL TABLE KEY COLUMN...      (psycopg; URL as libpq takes it)
       sql_rows.py mysql URL TABLE KEY COLUMN...   (pymysql; mysql://user:password@host:port/db)

Prints {"rows": [[value per COLUMN], ...]} ordered by KEY. A missing table reads as no rows.
"""

import json
import sys
from decimal import Decimal
from urllib.parse import unquote, urlparse


def canonical(value):
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, float):
        return float(f"{value:.9g}")
    if isinstance(value, Decimal):
        return float(f"{float(value):.9g}")
    return value


def postgres(url: str, table: str, key: str, columns: list) -> list:
    import psycopg
    from psycopg import sql

    with psycopg.connect(url, autocommit=True) as conn:
        if not conn.execute("SELECT to_regclass(%s) IS NOT NULL", (table,)).fetchone()[0]:
            return []
        query = sql.SQL("SELECT {} FROM {} ORDER BY {}").format(
            sql.SQL(", ").join(sql.Identifier(c) for c in columns),
            sql.Identifier(*table.split(".")),
            sql.Identifier(key),
        )
        return [list(row) for row in conn.execute(query)]


def mysql(url: str, table: str, key: str, columns: list) -> list:
    import pymysql

    parsed = urlparse(url)
    conn = pymysql.connect(
        host=parsed.hostname,
        port=parsed.port or 3306,
        user=unquote(parsed.username or ""),
        password=unquote(parsed.password or ""),
        database=parsed.path.lstrip("/"),
        autocommit=True,
    )
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = %s",
                (table,),
            )
            if not cur.fetchone()[0]:
                return []
            listed = ", ".join(f"`{c}`" for c in columns)
            cur.execute(f"SELECT {listed} FROM `{table}` ORDER BY `{key}`")
            return [list(row) for row in cur.fetchall()]
    finally:
        conn.close()


def main() -> None:
    kind, url, table, key, *columns = sys.argv[1:]
    rows = {"pg": postgres, "mysql": mysql}[kind](url, table, key, columns)
    print(json.dumps({"rows": [[canonical(v) for v in row] for row in rows]}))


if __name__ == "__main__":
    main()
