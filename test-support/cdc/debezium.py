"""Change-data-capture peer: Debezium's PostgreSQL connector in the `connect` service (scripts/services.sh), driven
over Kafka Connect's REST API, and a deterministic workload on the captured table. Rust tests run it as a
subprocess with the services venv's Python (RATCHET_PYTHON). No Ratchet code.

usage:
  debezium.py register CONNECT_URL NAME --table SCHEMA.TABLE --topic-prefix P --slot S --publication PUB
                       [--pg-url URL] [--schemas true|false] [--avro REGISTRY_URL] [--set KEY=VALUE ...]
                       [--timeout SECONDS] [--bootstrap KAFKA_BOOTSTRAP]
  debezium.py delete   CONNECT_URL NAME --slot S [--publication PUB] [--pg-url URL] [--timeout SECONDS]
  debezium.py workload --table SCHEMA.TABLE --ops N --seed K [--pg-url URL] [--create] [--replica-identity-full]
                       [--max-txn M]

register: a connector capturing exactly that table into topic P.SCHEMA.TABLE (snapshot.mode=initial, pgoutput,
  replication slot S, publication PUB created for that table only, decimal.handling.mode=string, tombstones after
  deletes). Converters: Kafka's JsonConverter with schemas on (--schemas true, the default) or off, or with
  --avro REGISTRY_URL Apicurio's AvroConverter in Confluent's wire format (0x00, the 4-byte schema id, the Avro
  body; schemas registered under P.SCHEMA.TABLE-key / -value, which the Confluent-compatible API at
  REGISTRY_URL = .../apis/ccompat/v7 serves; credentials RATCHET_REGISTRY_USER / RATCHET_REGISTRY_PASSWORD).
  --set adds or overrides any connector setting. The table must exist. Returns once the connector and its task are
  RUNNING and the snapshot is over (the slot's walsender runs START_REPLICATION), and with --bootstrap once the
  change topic exists (a table with rows; Connect creates it with the first record); the snapshot's records are then
  written or being committed (the worker writes in Kafka transactions: read them read_committed). Prints the
  connector's config as JSON (password masked). Creating a logical slot waits for every older transaction of the
  cluster to end, prepared ones included: a timeout then names the transactions it waits for.
delete: stops the connector, resets its source offsets (so a connector of the same name later snapshots again),
  deletes it, then drops its replication slot (terminating a replication connection still holding it after 20 s)
  and its publication (taken from the connector's config, or --publication). Topics stay. Idempotent: whatever is
  already gone is skipped. Prints what it removed as JSON.
workload: N operations, about 50% inserts, 35% updates, 15% deletes (an insert when the table is empty), in
  transactions of 1..M operations (default 5), all chosen by random.Random(K) from the ids in the table at start:
  the same seed on the same table state runs the same statements. Table columns: id int primary key, name text,
  qty bigint, price double precision, active boolean (--create makes it when missing). Prints one JSON line:
  {"insert": .., "update": .., "delete": .., "transactions": .., "rows": rows after, "max_id": ..}.

--pg-url defaults to RATCHET_PG_URL (postgres://user:password@host:port/db[?sslmode=...]). Every wait is bounded
(--timeout, default 60 s); a failure exits 1 with what failed (and the connector's status and trace) on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

CONNECTOR_CLASS = "io.debezium.connector.postgresql.PostgresConnector"
AVRO_CONVERTER = "io.apicurio.registry.utils.converter.AvroConverter"
JSON_CONVERTER = "org.apache.kafka.connect.json.JsonConverter"


class Failure(Exception):
    """Exits 1 with this message."""


# --- Kafka Connect REST --------------------------------------------------------------------------------------------


# How long a call is retried while the Connect worker answers that its group is rebalancing.
REBALANCE_RETRY_SECONDS = 60


def rest(method: str, url: str, body: dict | None = None, ok_missing: bool = False):
    """One REST call; returns the decoded JSON answer (None for an empty one, or for 404 when ok_missing).

    Kafka Connect refuses a request while its worker group rebalances, which every connector created or deleted
    starts (HTTP 409 "rebalance in progress", or 500 "a rebalance is expected"): the request was not carried out,
    so it is sent again, for up to REBALANCE_RETRY_SECONDS (tests create and delete connectors at the same time)."""
    data = json.dumps(body).encode() if body is not None else None
    deadline = time.monotonic() + REBALANCE_RETRY_SECONDS
    while True:
        request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json",
                                                                               "Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as reply:
                text = reply.read()
            break
        except urllib.error.HTTPError as e:
            if e.code == 404 and ok_missing:
                return None
            detail = e.read().decode(errors="replace")
            if e.code in (409, 500) and "rebalance" in detail.lower() and time.monotonic() < deadline:
                time.sleep(0.5)
                continue
            raise Failure(f"{method} {url}: HTTP {e.code}: {detail}") from None
        except urllib.error.URLError as e:
            raise Failure(f"{method} {url}: {e.reason} (is the connect service up? scripts/services.sh up connect)"
                          ) from None
    return json.loads(text) if text.strip() else None


def connector_url(connect: str, name: str, tail: str = "") -> str:
    return f"{connect.rstrip('/')}/connectors/{urllib.parse.quote(name, safe='')}{tail}"


def status_text(status: dict | None) -> str:
    return json.dumps(status, indent=2) if status is not None else "(no status: the connector does not exist)"


# --- PostgreSQL ----------------------------------------------------------------------------------------------------


def pg_params(url: str) -> dict:
    """Debezium's database.* settings from a postgres:// URL."""
    u = urllib.parse.urlparse(url)
    if u.scheme not in ("postgres", "postgresql") or not u.hostname:
        raise Failure(f"--pg-url must be postgres://user:password@host:port/db, not {url!r}")
    params = {
        "database.hostname": u.hostname,
        "database.port": str(u.port or 5432),
        "database.user": urllib.parse.unquote(u.username or ""),
        "database.password": urllib.parse.unquote(u.password or ""),
        "database.dbname": urllib.parse.unquote(u.path.lstrip("/")),
    }
    query = urllib.parse.parse_qs(u.query)
    if "sslmode" in query:
        params["database.sslmode"] = query["sslmode"][0]
    if "sslrootcert" in query:
        params["database.sslrootcert"] = query["sslrootcert"][0]
    return params


def pg_connect(url: str):
    import psycopg

    try:
        return psycopg.connect(url, connect_timeout=10, autocommit=True)
    except psycopg.Error as e:
        raise Failure(f"cannot connect to PostgreSQL at {redact(url)}: {e}") from None


def redact(url: str) -> str:
    return re.sub(r"://([^:/@]*):[^@]*@", r"://\1:***@", url)


def split_table(table: str) -> tuple[str, str]:
    if table.count(".") != 1:
        raise Failure(f"--table must be SCHEMA.TABLE, not {table!r}")
    schema, name = table.split(".")
    return schema, name


def quoted(table: str) -> str:
    from psycopg import sql

    schema, name = split_table(table)
    return sql.Identifier(schema, name)


# --- register --------------------------------------------------------------------------------------------------------


def registry_v2(url: str) -> str:
    """Apicurio's v2 API base for a registry URL (the Confluent-compatible .../apis/ccompat/v7 or the v2 one)."""
    base = re.sub(r"/apis/.*$", "", url.rstrip("/"))
    return f"{base}/apis/registry/v2"


def converter_settings(prefix: str, schemas: bool, avro: str | None) -> dict:
    if avro is None:
        return {f"{prefix}.converter": JSON_CONVERTER, f"{prefix}.converter.schemas.enable": str(schemas).lower()}
    p = f"{prefix}.converter"
    settings = {
        p: AVRO_CONVERTER,
        f"{p}.apicurio.registry.url": registry_v2(avro),
        f"{p}.apicurio.registry.auto-register": "true",
        f"{p}.apicurio.registry.find-latest": "true",
        # Confluent's wire format: magic byte 0 and the 4-byte content id, which is the schema id the
        # Confluent-compatible API answers for; no Apicurio headers.
        f"{p}.apicurio.registry.as-confluent": "true",
        f"{p}.apicurio.registry.use-id": "contentId",
        f"{p}.apicurio.registry.headers.enabled": "false",
    }
    user, password = os.environ.get("RATCHET_REGISTRY_USER"), os.environ.get("RATCHET_REGISTRY_PASSWORD")
    if user:
        settings[f"{p}.apicurio.auth.username"] = user
        settings[f"{p}.apicurio.auth.password"] = password or ""
    return settings


def connector_config(args) -> dict:
    schema, name = split_table(args.table)
    config = {
        "connector.class": CONNECTOR_CLASS,
        "tasks.max": "1",
        **pg_params(args.pg_url),
        "topic.prefix": args.topic_prefix,
        "plugin.name": "pgoutput",
        "slot.name": args.slot,
        "publication.name": args.publication,
        # The publication covers the captured table only (created, or altered to it, by the connector).
        "publication.autocreate.mode": "filtered",
        "schema.include.list": re.escape(schema),
        "table.include.list": f"{re.escape(schema)}\\.{re.escape(name)}",
        "snapshot.mode": "initial",
        "decimal.handling.mode": "string",
        "tombstones.on.delete": "true",
        # The worker runs with exactly.once.source.support=enabled: fail at once if this connector could not.
        "exactly.once.support": "required",
        **converter_settings("key", args.schemas, args.avro),
        **converter_settings("value", args.schemas, args.avro),
    }
    for item in args.set or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise Failure(f"--set wants KEY=VALUE, not {item!r}")
        config[key] = value
    return config


def replication_phase(pg_url: str, slot: str) -> tuple[bool, str]:
    """(streaming, what the slot's walsender does). Debezium creates the slot (CREATE_REPLICATION_SLOT, exporting the
    snapshot it reads), snapshots, then sends START_REPLICATION on the same connection: a walsender of the slot
    running START_REPLICATION means the snapshot is over. (pg_stat_activity shows a role its own sessions' queries;
    pg_stat_replication's state would need pg_read_all_stats.)"""
    with pg_connect(pg_url) as conn:
        row = conn.execute(
            "SELECT a.query, a.wait_event_type, a.wait_event FROM pg_stat_activity a"
            " WHERE a.backend_type = 'walsender' AND (a.pid = (SELECT active_pid FROM pg_replication_slots"
            " WHERE slot_name = %s) OR a.query LIKE %s) ORDER BY a.backend_start DESC LIMIT 1",
            (slot, f'CREATE_REPLICATION_SLOT "{slot}"%'),
        ).fetchone()
        if row is None:
            return False, f"no replication connection uses slot {slot} yet"
        query, wait_type, wait = row
        if query.startswith("START_REPLICATION"):
            return True, "streaming"
        what = f"the walsender of slot {slot} runs {query.strip()[:60]!r} (waiting: {wait_type}/{wait})"
        if query.startswith("CREATE_REPLICATION_SLOT") and wait_type == "Lock":
            # A logical slot is consistent only once every transaction older than it has ended, prepared ones too,
            # in any database of the cluster: a test that left a transaction prepared blocks every new slot.
            blockers = conn.execute(
                "SELECT 'prepared ' || gid || ' in ' || database || ' since ' || prepared FROM pg_prepared_xacts"
                " UNION ALL SELECT 'session ' || pid || ' (' || coalesce(datname, '?') || ') in a transaction since '"
                " || xact_start FROM pg_stat_activity WHERE backend_xid IS NOT NULL AND pid <> pg_backend_pid()"
            ).fetchall()
            what += "; it waits for these transactions to end: " + ("; ".join(b[0] for b in blockers) or "(none seen)")
        return False, what


def preflight(args) -> None:
    """Checks what Connect would report obscurely: with a wrong password its config validation answers HTTP 500 (a
    NullPointerException in Kafka Connect 4.4), and a missing table fails the task only after it started."""
    schema, name = split_table(args.table)
    with pg_connect(args.pg_url) as conn:
        if conn.execute("SELECT to_regclass(%s)", (f'"{schema}"."{name}"',)).fetchone()[0] is None:
            raise Failure(f"table {args.table} does not exist (create it first, e.g. workload --create --ops 0)")


def register(args) -> dict:
    config = connector_config(args)
    preflight(args)
    # PUT creates the connector or replaces its config; validation errors come back as HTTP 400 with the reasons.
    rest("PUT", connector_url(args.connect_url, args.name, "/config"), config)
    deadline = time.monotonic() + args.timeout
    status = None
    while True:
        status = rest("GET", connector_url(args.connect_url, args.name, "/status"), ok_missing=True)
        states = []
        if status:
            states = [status["connector"]["state"]] + [t["state"] for t in status.get("tasks", [])]
        if "FAILED" in states:
            raise Failure(f"connector {args.name} failed:\n{status_text(status)}")
        running = len(states) >= 2 and all(s == "RUNNING" for s in states)
        phase = ""
        if running:
            done, phase = replication_phase(args.pg_url, args.slot)
            if done and topic_exists(args, deadline):
                return config
        if time.monotonic() >= deadline:
            if not running:
                # A task that is creating its slot is not RUNNING yet (its start() has not returned).
                _, phase = replication_phase(args.pg_url, args.slot)
                raise Failure(f"connector {args.name} or its task is not RUNNING after {args.timeout:.0f} s: "
                              f"{phase}\n{status_text(status)}")
            raise Failure(f"connector {args.name} is RUNNING but has not finished its snapshot after "
                          f"{args.timeout:.0f} s: {phase}\n{status_text(status)}")
        time.sleep(0.25)


def topic_exists(args, deadline: float) -> bool:
    """With --bootstrap and a table with rows: whether the change topic exists yet (Kafka Connect's producer
    creates it with the snapshot's first record). Otherwise True."""
    if not args.bootstrap:
        return True
    schema, table = args.table.split(".", 1)
    with pg_connect(args.pg_url) as conn:
        empty = conn.execute(f'SELECT NOT EXISTS (SELECT 1 FROM "{schema}"."{table}")').fetchone()[0]
    if empty:
        return True
    from confluent_kafka.admin import AdminClient

    topic = f"{args.topic_prefix}.{args.table}"
    left = max(1.0, min(5.0, deadline - time.monotonic()))
    listed = AdminClient({"bootstrap.servers": args.bootstrap}).list_topics(topic, timeout=left)
    found = listed.topics.get(topic)
    return found is not None and found.error is None and len(found.partitions) > 0


# --- delete ----------------------------------------------------------------------------------------------------------


def wait_for(what: str, deadline: float, check) -> None:
    while not check():
        if time.monotonic() >= deadline:
            raise Failure(f"timed out waiting for {what}")
        time.sleep(0.25)


def delete(args) -> dict:
    done: dict = {"connector": False, "offsets": False, "slot": False, "publication": None}
    deadline = time.monotonic() + args.timeout
    url = connector_url(args.connect_url, args.name)
    config = rest("GET", f"{url}/config", ok_missing=True)
    publication = args.publication or (config or {}).get("publication.name")
    if config is not None:
        # Stop first: offsets can only be reset for a stopped connector, and a stopped task lets go of the slot.
        rest("PUT", f"{url}/stop")

        def stopped() -> bool:
            status = rest("GET", f"{url}/status", ok_missing=True)
            return status is None or status["connector"]["state"] == "STOPPED"

        wait_for(f"connector {args.name} to stop", deadline, stopped)
        try:
            rest("DELETE", f"{url}/offsets", ok_missing=True)
            done["offsets"] = True
        except Failure as e:
            # Not fatal: a connector name is normally used once per test.
            print(f"warning: could not reset the offsets of {args.name}: {e}", file=sys.stderr)
        rest("DELETE", url, ok_missing=True)
        wait_for(f"connector {args.name} to be deleted", deadline,
                 lambda: rest("GET", f"{url}/status", ok_missing=True) is None)
        done["connector"] = True
    with pg_connect(args.pg_url) as conn:
        def slot_pid():
            row = conn.execute(
                "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (args.slot,)
            ).fetchone()
            return row
        # The worker closes its replication connection when the task stops (within seconds); a task stuck creating
        # its slot (see replication_phase) never does, hence the cap.
        release_by = min(deadline, time.monotonic() + 20)
        while (row := slot_pid()) is not None and row[0] is not None and time.monotonic() < release_by:
            time.sleep(0.25)
        row = slot_pid()
        if row is not None:
            if row[0] is not None:
                print(f"warning: slot {args.slot} still used by pid {row[0]}; terminating it", file=sys.stderr)
                conn.execute("SELECT pg_terminate_backend(%s)", (row[0],))
                wait_for(f"slot {args.slot} to be released", time.monotonic() + 10,
                         lambda: (slot_pid() or [None])[0] is None)
            # A slot whose creation was cut short by that is gone already.
            if slot_pid() is not None:
                conn.execute("SELECT pg_drop_replication_slot(%s)", (args.slot,))
                done["slot"] = True
        if publication:
            from psycopg import sql

            exists = conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (publication,)).fetchone()
            if exists:
                conn.execute(sql.SQL("DROP PUBLICATION {}").format(sql.Identifier(publication)))
                done["publication"] = publication
    return done


# --- workload --------------------------------------------------------------------------------------------------------


def workload(args) -> dict:
    from psycopg import sql

    rng = random.Random(args.seed)
    table = quoted(args.table)
    counts = {"insert": 0, "update": 0, "delete": 0, "transactions": 0}
    with pg_connect(args.pg_url) as conn:
        if args.create:
            conn.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {} (id int PRIMARY KEY, name text, qty bigint,"
                    " price double precision, active boolean)"
                ).format(table)
            )
        if args.replica_identity_full:
            conn.execute(sql.SQL("ALTER TABLE {} REPLICA IDENTITY FULL").format(table))
        ids = [r[0] for r in conn.execute(sql.SQL("SELECT id FROM {} ORDER BY id").format(table))]
        next_id = (ids[-1] if ids else 0) + 1
        insert = sql.SQL("INSERT INTO {} (id, name, qty, price, active) VALUES (%s, %s, %s, %s, %s)").format(table)
        update = sql.SQL("UPDATE {} SET name = %s, qty = %s, price = %s, active = %s WHERE id = %s").format(table)
        remove = sql.SQL("DELETE FROM {} WHERE id = %s").format(table)

        def row(i: int, version: int) -> tuple:
            return (f"name-{i}-v{version}", rng.randint(-(2**40), 2**40), round(rng.uniform(-1e6, 1e6), 3),
                    rng.random() < 0.5)

        done = 0
        while done < args.ops:
            size = min(rng.randint(1, args.max_txn), args.ops - done)
            with conn.transaction():
                for _ in range(size):
                    roll = rng.random()
                    if not ids or roll < 0.50:
                        conn.execute(insert, (next_id, *row(next_id, 0)))
                        ids.append(next_id)
                        next_id += 1
                        counts["insert"] += 1
                    elif roll < 0.85:
                        i = ids[rng.randrange(len(ids))]
                        name, qty, price, active = row(i, counts["update"] + 1)
                        conn.execute(update, (name, qty, price, active, i))
                        counts["update"] += 1
                    else:
                        i = ids.pop(rng.randrange(len(ids)))
                        conn.execute(remove, (i,))
                        counts["delete"] += 1
            done += size
            counts["transactions"] += 1
        counts["rows"] = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(table)).fetchone()[0]
        counts["max_id"] = next_id - 1
    return counts


# --- command line ----------------------------------------------------------------------------------------------------


def parse(argv: list[str]):
    def boolean(text: str) -> bool:
        if text.lower() not in ("true", "false"):
            raise argparse.ArgumentTypeError("true or false")
        return text.lower() == "true"

    parser = argparse.ArgumentParser(prog="debezium.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    pg = {"default": os.environ.get("RATCHET_PG_URL"), "help": "postgres://user:password@host:port/db"}

    r = sub.add_parser("register")
    r.add_argument("connect_url")
    r.add_argument("name")
    r.add_argument("--table", required=True)
    r.add_argument("--topic-prefix", required=True)
    r.add_argument("--slot", required=True)
    r.add_argument("--publication", required=True)
    r.add_argument("--pg-url", **pg)
    r.add_argument("--schemas", type=boolean, default=True)
    r.add_argument("--avro", metavar="REGISTRY_URL")
    r.add_argument("--set", action="append", metavar="KEY=VALUE")
    r.add_argument("--timeout", type=float, default=60)
    r.add_argument("--bootstrap", metavar="KAFKA_BOOTSTRAP",
                   help="also wait until the change topic exists (for a table that has rows)")

    d = sub.add_parser("delete")
    d.add_argument("connect_url")
    d.add_argument("name")
    d.add_argument("--slot", required=True)
    d.add_argument("--publication")
    d.add_argument("--pg-url", **pg)
    d.add_argument("--timeout", type=float, default=60)

    w = sub.add_parser("workload")
    w.add_argument("--table", required=True)
    w.add_argument("--ops", type=int, required=True)
    w.add_argument("--seed", type=int, required=True)
    w.add_argument("--pg-url", **pg)
    w.add_argument("--create", action="store_true")
    w.add_argument("--replica-identity-full", action="store_true")
    w.add_argument("--max-txn", type=int, default=5)

    args = parser.parse_args(argv)
    if not args.pg_url:
        parser.error("--pg-url is required (or RATCHET_PG_URL in the environment)")
    return args


def main(argv: list[str]) -> int:
    args = parse(argv)
    try:
        if args.command == "register":
            out = register(args)
            out = {k: ("***" if "password" in k else v) for k, v in out.items()}
        elif args.command == "delete":
            out = delete(args)
        else:
            out = workload(args)
    except Failure as e:
        print(f"debezium.py {args.command}: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # noqa: BLE001 - name what failed, whatever it was
        print(f"debezium.py {args.command}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    print(json.dumps(out, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
