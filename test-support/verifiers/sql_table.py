"""Independent verifier: the values of one column in every committed row of a PostgreSQL or MariaDB table, and
the prepared (XA) transactions of the given Ratchet scopes still on the server, as JSON.

usage: sql_table.py pg URL TABLE COLUMN SCOPE...      (psycopg; URL as libpq takes it)
       sql_table.py mysql URL TABLE COLUMN SCOPE...   (pymysql; mysql://user:password@host:port/db)

Prints {"ids": [...one per row...], "prepared": [...global ids...]}. A missing table reads as no rows. Prepared
transactions are listed from pg_prepared_xacts / XA RECOVER and kept when their id starts with
"ratchet.<scope>." for one of the scopes.
"""

import json
import sys
from urllib.parse import unquote, urlparse


def ours(gid: str, scopes) -> bool:
    return any(gid.startswith(f"ratchet.{scope}.") for scope in scopes)


def postgres(url: str, table: str, column: str, scopes) -> dict:
    import psycopg
    from psycopg import sql

    with psycopg.connect(url, autocommit=True) as conn:
        exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (table,)).fetchone()[0]
        ids = []
        if exists:
            query = sql.SQL("SELECT {} FROM {}").format(sql.Identifier(column), sql.Identifier(*table.split(".")))
            ids = [row[0] for row in conn.execute(query)]
        gids = [row[0] for row in conn.execute("SELECT gid FROM pg_prepared_xacts WHERE database = current_database()")]
    return {"ids": ids, "prepared": [g for g in gids if ours(g, scopes)]}


def mysql(url: str, table: str, column: str, scopes) -> dict:
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
            ids = []
            if cur.fetchone()[0]:
                cur.execute(f"SELECT `{column}` FROM `{table}`")
                ids = [row[0] for row in cur.fetchall()]
            cur.execute("XA RECOVER")
            gids = [row[3][: row[1]].decode() if isinstance(row[3], bytes) else row[3][: row[1]] for row in cur.fetchall()]
    finally:
        conn.close()
    return {"ids": ids, "prepared": [g for g in gids if ours(g, scopes)]}


def main() -> None:
    kind, url, table, column, *scopes = sys.argv[1:]
    result = {"pg": postgres, "mysql": mysql}[kind](url, table, column, scopes)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
