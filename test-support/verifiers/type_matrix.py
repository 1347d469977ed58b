"""The type matrix: one schema with every type of the type contract (docs/types.md), rows at its edges, produced
with the ecosystem's own clients and checked value by value in every sink with each sink's independent reader.

usage:
  type_matrix.py produce avro|json|ids BOOTSTRAP TOPIC COUNT produce COUNT rows (confluent-kafka; Avro with the
                                                             AvroSerializer through the registry at
                                                             RATCHET_REGISTRY_URL, JSON as the JSON decoding reads it;
                                                             `ids`: Avro records of the id alone, the benchmark's
                                                             baseline)
  type_matrix.py avro-schema [--refused]                     the Avro schema (with --refused: plus the fields some
                                                             sink refuses, see REFUSED)
  type_matrix.py json-fields                                 the JSON decoding's declaration, as TOML
  type_matrix.py json-fields-json                            the same as {"toml": ...}
  type_matrix.py produce-refused BOOTSTRAP TOPIC             one record of the schema with the refused fields
  type_matrix.py refused                                     {field: [sinks that refuse it]}
  type_matrix.py check COUNT parquet DIR                     pyarrow
  type_matrix.py check COUNT iceberg URI WAREHOUSE TABLE     Apache Iceberg's Java library (IcebergRead)
  type_matrix.py check COUNT pg URL TABLE                    psycopg
  type_matrix.py check COUNT mysql URL TABLE                 pymysql
  type_matrix.py check COUNT kafka-json BOOTSTRAP TOPIC      a read_committed confluent-kafka consumer
  type_matrix.py check COUNT kafka-avro BOOTSTRAP TOPIC      the same with confluent-kafka's AvroDeserializer

`check` prints {"rows": rows read, "ids": distinct ids, "mismatches": [{"id", "field", "expected", "got"}...]}
(the first 50): every value of every row compared with what the generator produced, as the reader returns it
turned into Python's own types (Decimal, date, time, datetime, UUID, bytes), floats of float32 fields compared as
float32. Nothing of Ratchet is used here.
"""

import base64
import datetime
import decimal
import json
import os
import struct
import sys
import uuid
from decimal import Decimal

UTC = datetime.timezone.utc


def f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


# --- the schema -----------------------------------------------------------------------------------------------------

def optional(t):
    return ["null", t]


ADDRESS = {"type": "record", "name": "Address", "fields": [
    {"name": "city", "type": "string"},
    {"name": "zip", "type": optional("string"), "default": None},
]}
CUSTOMER = {"type": "record", "name": "Customer", "fields": [
    {"name": "name", "type": "string"},
    {"name": "address", "type": optional(ADDRESS), "default": None},
]}
LINE = {"type": "record", "name": "Line", "fields": [
    {"name": "sku", "type": "string"},
    {"name": "qty", "type": "int"},
    {"name": "unit", "type": optional({"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}),
     "default": None},
]}

# (name, Avro type, JSON decoding type, kind for comparisons)
FIELDS = [
    ("amount", {"type": "bytes", "logicalType": "decimal", "precision": 38, "scale": 10}, "decimal(38, 10)", "decimal"),
    ("price", {"type": "fixed", "name": "Price", "size": 8, "logicalType": "decimal", "precision": 18, "scale": 4},
     "decimal(18, 4)", "decimal"),
    ("ref", {"type": "string", "logicalType": "uuid"}, "uuid", "uuid"),
    ("day", {"type": "int", "logicalType": "date"}, "date", "date"),
    ("t_ms", {"type": "int", "logicalType": "time-millis"}, "time(ms)", "time"),
    ("t_us", {"type": "long", "logicalType": "time-micros"}, "time(us)", "time"),
    ("at_ms", {"type": "long", "logicalType": "timestamp-millis"}, "timestamptz(ms)", "instant"),
    ("at_us", {"type": "long", "logicalType": "timestamp-micros"}, "timestamptz(us)", "instant"),
    ("local_ms", {"type": "long", "logicalType": "local-timestamp-millis"}, "timestamp(ms)", "local"),
    ("local_us", {"type": "long", "logicalType": "local-timestamp-micros"}, "timestamp(us)", "local"),
    ("status", {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID", "SHIPPED"]}, "string", "text"),
    ("code", {"type": "fixed", "name": "Code", "size": 4}, "fixed(4)", "bytes"),
    ("blob", "bytes", "binary", "bytes"),
    ("ratio", "float", "float32", "float32"),
    ("score", "double", "float64", "float64"),
    ("flag", "boolean", "boolean", "bool"),
    ("small", "int", "int32", "int"),
    ("big", "long", "int64", "int"),
    ("name", "string", "string", "text"),
    ("note", "string", "string", "text"),
    ("customer", CUSTOMER, None, "customer"),
    ("lines", {"type": "array", "items": LINE}, None, "lines"),
    ("attrs", {"type": "map", "values": "long"}, None, "attrs"),
    ("tags", {"type": "array", "items": "string"}, None, "tags"),
]

# Fields some sink refuses, and which: checked with check-config only.
REFUSED = [
    ("at_ns", {"type": "long", "logicalType": "timestamp-nanos"}, ["iceberg", "pg", "mysql"]),
    ("local_ns", {"type": "long", "logicalType": "local-timestamp-nanos"}, ["iceberg", "pg", "mysql"]),
    ("huge", {"type": "bytes", "logicalType": "decimal", "precision": 60, "scale": 20}, ["iceberg"]),
]


def avro_schema(refused: bool = False) -> dict:
    fields = [{"name": "id", "type": "long"}]
    fields += [{"name": n, "type": optional(t), "default": None} for n, t, _, _ in FIELDS]
    if refused:
        fields += [{"name": n, "type": optional(t), "default": None} for n, t, _ in REFUSED]
    return {"type": "record", "name": "Matrix", "namespace": "ratchet.test", "fields": fields}


def json_fields() -> str:
    """The JSON decoding's `fields = [...]`, as TOML."""
    def item(kind: str, extra: str = "") -> str:
        return f'{{ type = "{kind}"{extra} }}'

    declared = ['{ name = "id", type = "int64", nullable = false }']
    for name, _, kind, _ in FIELDS:
        if kind is not None:
            declared.append(f'{{ name = "{name}", type = "{kind}" }}')
    address = ('{ name = "address", type = "struct", fields = [ { name = "city", type = "string", nullable = false }, '
               '{ name = "zip", type = "string" } ] }')
    declared.append('{ name = "customer", type = "struct", fields = [ { name = "name", type = "string", '
                    f'nullable = false }}, {address} ] }}')
    line = ('{ type = "struct", nullable = false, fields = [ { name = "sku", type = "string", nullable = false }, '
            '{ name = "qty", type = "int32", nullable = false }, { name = "unit", type = "decimal(10, 2)" } ] }')
    declared.append(f'{{ name = "lines", type = "list", items = {line} }}')
    declared.append(f'{{ name = "attrs", type = "map", values = {item("int64", ", nullable = false")} }}')
    declared.append(f'{{ name = "tags", type = "list", items = {item("string", ", nullable = false")} }}')
    return "[\n    " + ",\n    ".join(declared) + ",\n]"


# --- the rows -------------------------------------------------------------------------------------------------------

def row(i: int) -> dict:
    """Row `i`: 0 at the upper edges, 1 at the lower edges, 2 mostly null, the rest varied."""
    r = {"id": i}
    if i == 2:
        r.update({n: None for n, _, _, _ in FIELDS})
        r.update({"name": "", "lines": [], "attrs": {}, "tags": []})
        return r
    top, bottom = i == 0, i == 1
    sign = -1 if i % 3 == 1 else 1

    def pick(upper, lower, other):
        return upper if top else lower if bottom else other

    r["amount"] = pick(Decimal("9999999999999999999999999999.9999999999"),
                       Decimal("-9999999999999999999999999999.9999999999"),
                       sign * Decimal(f"{i * 7919}.{(i * 104729) % 10**10:010d}"))
    r["price"] = pick(Decimal("99999999999999.9999"), Decimal("-99999999999999.9999"),
                      Decimal(f"{i}.{i % 10000:04d}") * sign)
    r["ref"] = uuid.UUID(int=(i * 0x1F123BB5159A55E5D1B52A3C4F9A2D71) % 2**128)
    r["day"] = pick(datetime.date(9999, 12, 31), datetime.date(1, 1, 1),
                    datetime.date(1969, 12, 31) + datetime.timedelta(days=i * 37 * sign))
    r["t_ms"] = pick(datetime.time(23, 59, 59, 999000), datetime.time(0, 0),
                     (datetime.datetime(2000, 1, 1) + datetime.timedelta(milliseconds=i * 1234567 % 86400000)).time())
    r["t_us"] = pick(datetime.time(23, 59, 59, 999999), datetime.time(0, 0, 0, 1),
                     (datetime.datetime(2000, 1, 1) + datetime.timedelta(microseconds=i * 12345678901 % 86400000000)).time())
    epoch = datetime.datetime(1970, 1, 1, tzinfo=UTC)
    r["at_ms"] = pick(datetime.datetime(9999, 12, 31, 23, 59, 59, 999000, tzinfo=UTC),
                      datetime.datetime(1900, 1, 1, 0, 0, 0, 1000, tzinfo=UTC),
                      epoch + datetime.timedelta(milliseconds=sign * i * 98765432101))
    r["at_us"] = pick(datetime.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
                      datetime.datetime(1900, 1, 1, 0, 0, 0, 1, tzinfo=UTC),
                      epoch + datetime.timedelta(microseconds=sign * i * 98765432101123))
    r["local_ms"] = r["at_ms"].replace(tzinfo=None) - datetime.timedelta(hours=i % 7)
    r["local_us"] = r["at_us"].replace(tzinfo=None) - datetime.timedelta(hours=i % 5)
    r["status"] = ["NEW", "PAID", "SHIPPED"][i % 3]
    r["code"] = bytes([i % 256, 0, 255, (i * 7) % 256])
    r["blob"] = pick(bytes(range(256)) * 4, b"", bytes((i * j) % 256 for j in range(i % 17)))
    r["ratio"] = pick(f32(3.4028234663852886e38), f32(-1.1754943508222875e-38), f32(sign * i / 7))
    r["score"] = pick(1.7976931348623157e308, -2.2250738585072014e-308, sign * i / 3)
    r["flag"] = i % 2 == 0
    r["small"] = pick(2**31 - 1, -(2**31), sign * i * 1000)
    r["big"] = pick(2**63 - 1, -(2**63), sign * i * 10**12)
    r["name"] = pick('日本語 😀 ü "quoted" \\ \n\ttab', "", f"name-{i}")
    r["note"] = None if i % 4 == 0 else f"note ✓ {i}"
    address = None if i % 5 == 0 else {"city": f"city-{i}", "zip": None if i % 2 else f"{i:05d}"}
    r["customer"] = {"name": f"customer-{i}", "address": address}
    r["lines"] = pick([{"sku": "max", "qty": 2**31 - 1, "unit": Decimal("99999999.99")},
                       {"sku": "none", "qty": 0, "unit": None}],
                      [],
                      [{"sku": f"sku-{i}-{k}", "qty": k, "unit": Decimal(f"{k}.{i % 100:02d}")} for k in range(i % 3 + 1)])
    r["attrs"] = pick({"max": 2**63 - 1, "ü": -1}, {}, {f"k{k}": k * i for k in range(i % 4)})
    r["tags"] = pick(["a", "ü", ""], [], [f"t{k}" for k in range(i % 3)])
    return r


def json_value(value):
    """A row value as the JSON decoding takes it (decimals as strings, bytes in base64, date-times in ISO form)."""
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, (datetime.date, datetime.time, datetime.datetime)):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: json_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_value(v) for v in value]
    return value


def registry_client():
    from confluent_kafka.schema_registry import SchemaRegistryClient

    return SchemaRegistryClient({
        "url": os.environ["RATCHET_REGISTRY_URL"],
        "basic.auth.user.info": f"{os.environ['RATCHET_REGISTRY_USER']}:{os.environ['RATCHET_REGISTRY_PASSWORD']}",
        # Bounded (the client's default is none) and retried: a registry request once hung here forever.
        "timeout": 30,
    })


# The benchmark's baseline (worker/benches/types.rs): the same records with nothing but the id.
IDS_SCHEMA = {"type": "record", "name": "Ids", "namespace": "ratchet.test", "fields": [{"name": "id", "type": "long"}]}


def many_rows(i: int) -> dict:
    """Row `i` for any count: the values of rows 0..599 again (beyond, `row`'s dates leave years 1..9999), with
    id `i`."""
    return dict(row(i % 600), id=i)


def produce(form: str, bootstrap: str, topic: str, count: str) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.serialization import MessageField, SerializationContext

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    if form in ("avro", "ids"):
        from confluent_kafka.schema_registry.avro import AvroSerializer

        schema = avro_schema() if form == "avro" else IDS_SCHEMA
        serialize = AvroSerializer(registry_client(), json.dumps(schema))
        context = SerializationContext(topic, MessageField.VALUE)
        make = many_rows if form == "avro" else (lambda i: {"id": i})
        encode = lambda r: serialize(r, context)  # noqa: E731
    else:
        make = many_rows
        encode = lambda r: json.dumps(json_value(r), ensure_ascii=False).encode()  # noqa: E731
    failures = []
    for i in range(int(count)):
        producer.produce(topic, key=str(i).encode(), value=encode(make(i)),
                         on_delivery=lambda err, _m: failures.append(str(err)) if err else None)
        producer.poll(0)
    if producer.flush(30) != 0 or failures:
        raise SystemExit(f"not every record was acknowledged: {failures or 'flush timed out'}")
    print(json.dumps({"count": int(count)}))


def produce_refused(bootstrap: str, topic: str) -> None:
    """One record of the schema with the refused fields (all null): registers it as the subject's latest."""
    from confluent_kafka import Producer
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    serialize = AvroSerializer(registry_client(), json.dumps(avro_schema(refused=True)))
    record = row(3)
    record.update({n: None for n, _, _ in REFUSED})
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic, value=serialize(record, SerializationContext(topic, MessageField.VALUE)))
    if producer.flush(30) != 0:
        raise SystemExit("the record was not acknowledged")
    print(json.dumps({"count": 1}))


# --- turning what readers return into Python's own types ----------------------------------------------------------

def to_instant(v):
    if isinstance(v, datetime.datetime):
        return v.astimezone(UTC) if v.tzinfo else v.replace(tzinfo=UTC)
    return datetime.datetime.fromisoformat(v).astimezone(UTC)


def to_local(v):
    if isinstance(v, datetime.datetime):
        return v.replace(tzinfo=None)
    return datetime.datetime.fromisoformat(v)


def to_time(v):
    if isinstance(v, datetime.time):
        return v
    if isinstance(v, datetime.timedelta):
        return (datetime.datetime(2000, 1, 1) + v).time()
    return datetime.time.fromisoformat(v)


def to_bytes(v):
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v)
    if isinstance(v, str) and v.startswith("base64:"):
        v = v[len("base64:"):]
    return base64.b64decode(v)


def to_decimal(v):
    return v if isinstance(v, Decimal) else Decimal(str(v))


def to_uuid(v):
    if isinstance(v, uuid.UUID):
        return v
    if isinstance(v, (bytes, bytearray)):
        return uuid.UUID(bytes=bytes(v))
    return uuid.UUID(str(v))


def to_bool(v):
    return v if isinstance(v, bool) else (v in (1, "1", "true", "True"))


def as_json(v):
    """A nested value that a reader returns as JSON text (MariaDB) or as parsed JSON."""
    if isinstance(v, str):
        return json.loads(v, parse_float=Decimal)
    return v


def normalize(kind: str, v):
    if v is None:
        return None
    if kind == "decimal":
        return to_decimal(v)
    if kind == "uuid":
        return to_uuid(v)
    if kind == "date":
        return v if isinstance(v, datetime.date) else datetime.date.fromisoformat(v)
    if kind == "time":
        return to_time(v)
    if kind == "instant":
        return to_instant(v)
    if kind == "local":
        return to_local(v)
    if kind == "text":
        return v
    if kind == "bytes":
        return to_bytes(v)
    if kind == "float32":
        return f32(float(v))
    if kind == "float64":
        return float(v)
    if kind == "bool":
        return to_bool(v)
    if kind == "int":
        return int(v)
    if kind == "customer":
        v = as_json(v)
        address = v.get("address")
        return {"name": v["name"], "address": None if address is None else
                {"city": address["city"], "zip": address.get("zip")}}
    if kind == "lines":
        return [{"sku": line["sku"], "qty": int(line["qty"]), "unit": normalize("decimal", line.get("unit"))}
                for line in as_json(v)]
    if kind == "attrs":
        v = as_json(v)
        pairs = v.items() if isinstance(v, dict) else v
        return {k: int(x) for k, x in pairs}
    if kind == "tags":
        return list(as_json(v))
    raise ValueError(kind)


def compare(count: int, rows: list) -> dict:
    """Every row read (dicts by column name) against the generator's."""
    mismatches, seen = [], set()
    kinds = dict((n, k) for n, _, _, k in FIELDS)
    for got in rows:
        i = int(got["id"])
        seen.add(i)
        expected = row(i)
        for name, kind in kinds.items():
            want = normalize(kind, expected[name]) if kind in ("customer", "lines", "attrs", "tags") else expected[name]
            if kind == "tags" and want is None:
                want = None
            try:
                have = normalize(kind, got.get(name))
            except Exception as e:  # noqa: BLE001 - a value that does not even convert is a mismatch
                have = f"unreadable: {e!r} from {got.get(name)!r}"
            if have != want:
                mismatches.append({"id": i, "field": name, "expected": repr(want), "got": repr(have)})
    missing = sorted(set(range(count)) - seen)
    if missing:
        mismatches.insert(0, {"id": None, "field": "rows", "expected": "every id", "got": f"missing {missing[:20]}"})
    return {"rows": len(rows), "ids": len(seen), "mismatches": mismatches[:50]}


# --- the readers ----------------------------------------------------------------------------------------------------

def read_parquet(directory: str) -> list:
    import pyarrow.parquet as pq

    rows = []
    for walked, _, names in os.walk(directory):
        for name in sorted(names):
            if name.endswith(".parquet") and not name.startswith("."):
                table = pq.read_table(os.path.join(walked, name))
                for r in table.to_pylist():
                    if isinstance(r.get("attrs"), list):
                        r["attrs"] = dict(r["attrs"])
                    rows.append(r)
    return rows


def read_iceberg(uri: str, warehouse: str, table_name: str) -> list:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import iceberg_table
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("ratchet", uri=uri, warehouse=warehouse, **iceberg_table.s3_props())
    table = iceberg_table.load_table(catalog, table_name)
    read = iceberg_table.java_read(table.metadata_location)
    return [dict(zip(read["column_names"], values)) for values in read["rows"]]


def read_sql(kind: str, url: str, table: str) -> list:
    if kind == "pg":
        import psycopg
        from psycopg.types.json import set_json_loads

        with psycopg.connect(url, autocommit=True) as conn:
            # jsonb as its text, parsed once by `as_json` like MariaDB's: a double-encoded document stays a string.
            set_json_loads(lambda s: s if isinstance(s, str) else bytes(s).decode(), conn)
            conn.execute("SET TIME ZONE 'UTC'")
            cur = conn.execute(f'SELECT * FROM "{table}"')
            names = [d.name for d in cur.description]
            return [dict(zip(names, r)) for r in cur.fetchall()]
    import pymysql
    from urllib.parse import unquote, urlparse

    parsed = urlparse(url)
    conn = pymysql.connect(host=parsed.hostname, port=parsed.port or 3306, user=unquote(parsed.username or ""),
                           password=unquote(parsed.password or ""), database=parsed.path.lstrip("/"),
                           autocommit=True, charset="utf8mb4", init_command="SET time_zone = '+00:00'")
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT * FROM `{table}`")
            names = [d[0] for d in cur.description]
            return [dict(zip(names, r)) for r in cur.fetchall()]
    finally:
        conn.close()


def read_kafka(bootstrap: str, topic: str, avro: bool) -> list:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from confluent_kafka import Consumer, IsolationLevel, TopicPartition
    from confluent_kafka.admin import AdminClient

    import kafka_read_committed

    admin = AdminClient({"bootstrap.servers": bootstrap})
    meta = admin.list_topics(topic, timeout=30).topics[topic]
    tps = [TopicPartition(topic, p) for p in sorted(meta.partitions)]
    lso = kafka_read_committed.latest(admin, tps, IsolationLevel.READ_COMMITTED)
    decode = None
    if avro:
        from confluent_kafka.schema_registry.avro import AvroDeserializer
        from confluent_kafka.serialization import MessageField, SerializationContext

        deserialize = AvroDeserializer(registry_client())
        decode = lambda v: deserialize(v, SerializationContext(topic, MessageField.VALUE))  # noqa: E731
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"matrix-{uuid.uuid4().hex[:8]}",
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, tp.partition, 0) for tp in tps if lso[tp.partition] > 0])
    done = {p for p, end in lso.items() if end == 0}
    rows = []
    import time

    deadline = time.monotonic() + 60
    while len(done) < len(tps):
        if time.monotonic() > deadline:
            raise SystemExit(f"did not reach the LSO of every partition in 60 s: {lso}")
        msg = consumer.poll(0.5)
        if msg is None:
            for tp in consumer.position([TopicPartition(topic, p) for p in lso if p not in done]):
                if tp.offset >= lso[tp.partition]:
                    done.add(tp.partition)
            continue
        if msg.error():
            raise SystemExit(f"consumer error: {msg.error()}")
        value = decode(msg.value()) if decode else json.loads(msg.value(), parse_float=Decimal)
        rows.append(value)
        if msg.offset() + 1 >= lso[msg.partition()]:
            done.add(msg.partition())
    consumer.close()
    return rows


def check(count: str, sink: str, *args: str) -> None:
    if sink == "parquet":
        rows = read_parquet(args[0])
    elif sink == "iceberg":
        rows = read_iceberg(*args)
    elif sink in ("pg", "mysql"):
        rows = read_sql(sink, *args)
    elif sink in ("kafka-json", "kafka-avro"):
        rows = read_kafka(args[0], args[1], sink == "kafka-avro")
    else:
        raise SystemExit(f"unknown sink {sink!r}")
    print(json.dumps(compare(int(count), rows)))


def main() -> None:
    command, *args = sys.argv[1:]
    if command == "produce":
        produce(*args)
    elif command == "avro-schema":
        print(json.dumps(avro_schema(refused="--refused" in args)))
    elif command == "json-fields":
        print(json_fields())
    elif command == "json-fields-json":
        print(json.dumps({"toml": json_fields()}))
    elif command == "produce-refused":
        produce_refused(*args)
    elif command == "refused":
        print(json.dumps({n: sinks for n, _, sinks in REFUSED}))
    elif command == "check":
        check(*args)
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    decimal.getcontext().prec = 100
    main()
    sys.stdout.flush()
    os._exit(0)
