"""Producer peer: writes records to Kafka as an application of the Confluent ecosystem does, with confluent-kafka's
SchemaRegistryClient and JSONSerializer (the JSON Schema registered under <topic>-value, values in the Confluent wire
format: 0x00, the 4-byte schema id, the JSON document). No Ratchet code and no hand-framed bytes.

usage: confluent_json.py BOOTSTRAP TOPIC SCHEMA RECORDS [--no-validate]

SCHEMA is a JSON Schema document; RECORDS a JSON list of objects (each keyed by its `id` field, when it has one, as
text). JSONSerializer validates every record against the schema before it is written. With --no-validate the records
are framed by this script instead (the schema registered under the same subject, its id in front of json.dumps of
each record), so a test can write records that violate the schema, the way a producer without validation would. The registry is
RATCHET_REGISTRY_URL with RATCHET_REGISTRY_USER / RATCHET_REGISTRY_PASSWORD. Every record is acknowledged before the
script ends. Prints {"schema_id": the id the values carry, "count": records written}.
"""

import json
import os
import sys

from confluent_kafka import Producer
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.serialization import MessageField, SerializationContext


def main(bootstrap: str, topic: str, schema: str, records: str, *flags: str) -> None:
    registry = SchemaRegistryClient({
        "url": os.environ["RATCHET_REGISTRY_URL"],
        "basic.auth.user.info": f"{os.environ['RATCHET_REGISTRY_USER']}:{os.environ['RATCHET_REGISTRY_PASSWORD']}",
        # Bounded (the client's default is none) and retried: a registry request once hung here forever.
        "timeout": 30,
    })
    if "--no-validate" in flags:
        schema_id = registry.register_schema(f"{topic}-value", Schema(schema, "JSON"))

        def serialize(row, _context):
            return b"\x00" + schema_id.to_bytes(4, "big") + json.dumps(row).encode()
    else:
        serialize = JSONSerializer(schema, registry)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    failures = []
    schema_ids = set()

    def delivered(err, _msg):
        if err is not None:
            failures.append(str(err))

    context = SerializationContext(topic, MessageField.VALUE)
    for row in json.loads(records):
        value = serialize(row, context)
        schema_ids.add(int.from_bytes(value[1:5], "big"))
        key = str(row["id"]).encode() if "id" in row else None
        producer.produce(topic, key=key, value=value, on_delivery=delivered)
        producer.poll(0)
    if producer.flush(30) != 0 or failures:
        raise SystemExit(f"not every record was acknowledged: {failures or 'flush timed out'}")
    if len(schema_ids) > 1:
        raise SystemExit(f"one schema, one id expected; the values carry {sorted(schema_ids)}")
    print(json.dumps({"schema_id": schema_ids.pop() if schema_ids else None, "count": len(json.loads(records))}))


if __name__ == "__main__":
    main(*sys.argv[1:])
