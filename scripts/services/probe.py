"""Readiness and status probes for scripts/services.sh: each makes one real request and prints what answered.

Endpoints come from the RATCHET_* variables that `scripts/services.sh env` prints (services.sh sets them).
Exit status 0 = the service answered; anything else = it did not (the reason goes to stderr).
"""

import os
import sys
import uuid


def kafka(bootstrap: str) -> str:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})  # keep a reference: the future dies with its client
    cluster = admin.describe_cluster(request_timeout=10).result(timeout=15)
    # Ready means the transaction coordinator works, not just that the port is open.
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": f"ratchet-probe-{uuid.uuid4()}",
            "transaction.timeout.ms": 10000,
        }
    )
    producer.init_transactions(15)
    producer.begin_transaction()
    producer.abort_transaction(15)
    return f"cluster {cluster.cluster_id}, init_transactions ok"


def kafka_secure_settings(mechanism: str) -> dict:
    """librdkafka settings for the SASL_SSL listener with `mechanism`, from the RATCHET_* variables."""
    return {
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": os.environ["RATCHET_TLS_CA"],
        "sasl.mechanism": mechanism,
        "sasl.username": os.environ["RATCHET_KAFKA_SASL_USERNAME"],
        "sasl.password": os.environ["RATCHET_KAFKA_SASL_PASSWORD"],
    }


def kafka_scram_user(bootstrap: str) -> str:
    """Stores (or replaces) the test user's SCRAM-SHA-256 and SCRAM-SHA-512 credentials, over `bootstrap`."""
    from confluent_kafka.admin import AdminClient, ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

    user = os.environ["RATCHET_KAFKA_SASL_USERNAME"]
    password = os.environ["RATCHET_KAFKA_SASL_PASSWORD"].encode()
    admin = AdminClient({"bootstrap.servers": bootstrap})
    # One request per mechanism: the broker refuses two changes to one user in a request.
    for mechanism in (ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512):
        upsert = UserScramCredentialUpsertion(user, ScramCredentialInfo(mechanism, 8192), password)
        for future in admin.alter_user_scram_credentials([upsert]).values():
            future.result(timeout=15)
    return f"SCRAM-SHA-256 and SCRAM-SHA-512 credentials of {user} stored"


def kafka_secure(bootstrap: str) -> str:
    """The SASL_SSL listener accepts the test user with every mechanism (TLS verified against the test CA)."""
    from confluent_kafka.admin import AdminClient

    for mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
        admin = AdminClient({"bootstrap.servers": bootstrap, **kafka_secure_settings(mechanism)})
        admin.describe_cluster(request_timeout=10).result(timeout=15)
    return "SASL_SSL with PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 ok"


def postgres() -> str:
    import psycopg

    with psycopg.connect(os.environ["RATCHET_PG_URL"], connect_timeout=5) as conn:
        version = conn.execute("SHOW server_version").fetchone()[0]
        prepared = int(conn.execute("SHOW max_prepared_transactions").fetchone()[0])
        wal_level = conn.execute("SHOW wal_level").fetchone()[0]
        slots = int(conn.execute("SHOW max_replication_slots").fetchone()[0])
        replication = conn.execute(
            "SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user"
        ).fetchone()[0]
    if prepared < 64:
        raise SystemExit(f"max_prepared_transactions is {prepared}, need >= 64")
    # Debezium (the connect service) decodes the WAL logically, with a replication slot of its own per connector.
    if wal_level != "logical" or slots < 10:
        raise SystemExit(f"wal_level is {wal_level} and max_replication_slots {slots}, need logical and >= 10")
    if not replication:
        raise SystemExit("the test user has no REPLICATION attribute")
    # TLS: a verify-full connection against the test CA must work.
    with psycopg.connect(
        os.environ["RATCHET_PG_URL"], connect_timeout=5, sslmode="verify-full", sslrootcert=os.environ["RATCHET_TLS_CA"]
    ) as conn:
        ssl = conn.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetchone()[0]
    if not ssl:
        raise SystemExit("a sslmode=verify-full connection is not encrypted")
    return f"PostgreSQL {version}, max_prepared_transactions={prepared}, wal_level={wal_level}, TLS ok"


def mariadb() -> str:
    from urllib.parse import urlparse

    import pymysql

    url = urlparse(os.environ["RATCHET_MYSQL_URL"])
    conn = pymysql.connect(
        host=url.hostname, port=url.port, user=url.username, password=url.password,
        database=url.path.lstrip("/"), connect_timeout=5,
    )
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT VERSION()")
            version = cur.fetchone()[0]
            xid = f"ratchet-probe-{uuid.uuid4().hex[:12]}"
            for stmt in (f"XA START '{xid}'", f"XA END '{xid}'", f"XA PREPARE '{xid}'"):
                cur.execute(stmt)
            cur.execute("XA RECOVER")
            seen = any(row[3] == xid.encode() or row[3] == xid for row in cur.fetchall())
            cur.execute(f"XA ROLLBACK '{xid}'")
    finally:
        conn.close()
    if not seen:
        raise SystemExit("XA RECOVER did not list a prepared XA transaction")
    return f"MariaDB {version}, XA prepare/recover/rollback ok"


def s3(create_bucket: bool) -> str:
    import boto3
    from botocore.config import Config

    client = boto3.client(
        "s3",
        endpoint_url=os.environ["RATCHET_S3_ENDPOINT"],
        region_name=os.environ["RATCHET_S3_REGION"],
        aws_access_key_id=os.environ["RATCHET_S3_ACCESS_KEY"],
        aws_secret_access_key=os.environ["RATCHET_S3_SECRET_KEY"],
        config=Config(s3={"addressing_style": "path"}, connect_timeout=3, read_timeout=10, retries={"max_attempts": 1}),
    )
    bucket = os.environ["RATCHET_S3_BUCKET"]
    names = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
    if bucket not in names:
        if not create_bucket:
            raise SystemExit(f"bucket {bucket} does not exist")
        client.create_bucket(Bucket=bucket)
    client.put_object(Bucket=bucket, Key="_probe/ready", Body=b"ok")
    return f"S3 bucket {bucket} read/write ok, {iceberg_rest()}"


def iceberg_rest() -> str:
    """The Iceberg REST catalog hands out a token for the S3 key pair and knows the table bucket."""
    import json
    import urllib.parse
    import urllib.request

    uri = os.environ["RATCHET_ICEBERG_REST_URI"]
    warehouse = os.environ["RATCHET_ICEBERG_REST_WAREHOUSE"]
    form = urllib.parse.urlencode(
        {
            "grant_type": "client_credentials",
            "client_id": os.environ["RATCHET_S3_ACCESS_KEY"],
            "client_secret": os.environ["RATCHET_S3_SECRET_KEY"],
            "scope": "catalog",
        }
    ).encode()
    with urllib.request.urlopen(f"{uri}/v1/oauth/tokens", data=form, timeout=5) as reply:
        token = json.load(reply)["access_token"]
    query = urllib.parse.urlencode({"warehouse": warehouse})
    with urllib.request.urlopen(f"{uri}/v1/config?{query}", timeout=5) as reply:
        prefix = json.load(reply)["overrides"]["prefix"]
    listing = urllib.request.Request(f"{uri}/v1/{prefix}/namespaces", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(listing, timeout=5):
        pass
    return f"Iceberg REST catalog {warehouse} ok"


def main(argv: list[str]) -> int:
    if not argv:
        print(
            "usage: probe.py kafka [bootstrap]|kafka-secure BOOTSTRAP|kafka-scram-user BOOTSTRAP|postgres|mariadb"
            "|s3 [--create-bucket]",
            file=sys.stderr,
        )
        return 2
    what = argv[0]
    try:
        if what == "kafka":
            out = kafka(argv[1] if len(argv) > 1 else os.environ["RATCHET_KAFKA_BOOTSTRAP"])
        elif what == "kafka-secure":
            out = kafka_secure(argv[1])
        elif what == "kafka-scram-user":
            out = kafka_scram_user(argv[1])
        elif what == "postgres":
            out = postgres()
        elif what == "mariadb":
            out = mariadb()
        elif what == "s3":
            out = s3("--create-bucket" in argv[1:])
        else:
            print(f"unknown probe {what}", file=sys.stderr)
            return 2
    except SystemExit as e:
        print(f"{what}: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # noqa: BLE001 - a probe reports any failure as "not ready", with the reason
        print(f"{what}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
