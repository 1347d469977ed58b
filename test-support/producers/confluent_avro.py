"""Producer peer: writes records to Kafka as an application of the Confluent ecosystem does, with confluent-kafka's
SchemaRegistryClient and AvroSerializer (the schema registered under its subject, values in the Confluent wire
format: 0x00, the 4-byte schema id, the Avro body). No Ratchet code and no hand-framed bytes.

usage: confluent_avro.py BOOTSTRAP TOPIC SCHEMA RECORDS [SUBJECT_STRATEGY [COMPATIBILITY]]

SCHEMA is Avro schema JSON; RECORDS a JSON list of objects (each keyed by its `id` field, when it has one, as
text; a top-level decimal field's value given as text, "12.34", is written as that exact decimal). SUBJECT_STRATEGY is topic-name (default), record-name or topic-record-name. COMPATIBILITY, when given, is
set on the subject first (NONE lets a test register a change the registry's BACKWARD default refuses). The registry is
RATCHET_REGISTRY_URL with RATCHET_REGISTRY_USER / RATCHET_REGISTRY_PASSWORD. Every record is acknowledged before
the script ends. Prints {"schema_id": the id the values carry, "count": records written}.
"""

import json
import os
import sys
from decimal import Decimal

from confluent_kafka import Producer
from confluent_kafka.schema_registry import (
    SchemaRegistryClient,
    record_subject_name_strategy,
    topic_record_subject_name_strategy,
    topic_subject_name_strategy,
)
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

STRATEGIES = {
    "topic-name": topic_subject_name_strategy,
    "record-name": record_subject_name_strategy,
    "topic-record-name": topic_record_subject_name_strategy,
}


def decimal_fields(schema: str) -> set:
    """The top-level fields whose type (or a branch of its union) is a decimal."""
    def is_decimal(t) -> bool:
        if isinstance(t, list):
            return any(is_decimal(branch) for branch in t)
        return isinstance(t, dict) and t.get("logicalType") == "decimal"
    return {f["name"] for f in json.loads(schema).get("fields", []) if is_decimal(f["type"])}


def main(
    bootstrap: str, topic: str, schema: str, records: str, strategy: str = "topic-name", compatibility: str = ""
) -> None:
    registry = SchemaRegistryClient({
        "url": os.environ["RATCHET_REGISTRY_URL"],
        "basic.auth.user.info": f"{os.environ['RATCHET_REGISTRY_USER']}:{os.environ['RATCHET_REGISTRY_PASSWORD']}",
        # Bounded (the client's default is none) and retried: a registry request once hung here forever.
        "timeout": 30,
    })
    if compatibility:
        if strategy != "topic-name":
            raise SystemExit("COMPATIBILITY is set on the subject <topic>-value: use the topic-name strategy")
        registry.set_compatibility(f"{topic}-value", compatibility)
    serialize = AvroSerializer(registry, schema, conf={"subject.name.strategy": STRATEGIES[strategy]})
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    failures = []
    schema_ids = set()

    def delivered(err, _msg):
        if err is not None:
            failures.append(str(err))

    context = SerializationContext(topic, MessageField.VALUE)
    rows = json.loads(records)
    decimals = decimal_fields(schema)
    for row in rows:
        for name in decimals & row.keys():
            if row[name] is not None:
                row[name] = Decimal(str(row[name]))
    for row in rows:
        value = serialize(row, context)
        schema_ids.add(int.from_bytes(value[1:5], "big"))
        key = str(row["id"]).encode() if "id" in row else None
        producer.produce(topic, key=key, value=value, on_delivery=delivered)
        producer.poll(0)
    if producer.flush(30) != 0 or failures:
        raise SystemExit(f"not every record was acknowledged: {failures or 'flush timed out'}")
    if len(schema_ids) > 1:
        raise SystemExit(f"one schema, one id expected; the values carry {sorted(schema_ids)}")
    print(json.dumps({"schema_id": schema_ids.pop() if schema_ids else None, "count": len(rows)}))


if __name__ == "__main__":
    main(*sys.argv[1:])
