"""Independent verifier: every record of a topic that a read_committed consumer sees, as JSON.

usage: kafka_read_committed.py BOOTSTRAP TOPIC [--avro | --json-schema | --protobuf]

Reads every partition from the beginning up to its last stable offset (LSO) with confluent-kafka (librdkafka's
own client, no Ratchet code). Prints {"records": [{"partition", "offset", "key", "value", "headers"}...],
"partitions": {p: {"lso": .., "high_watermark": ..}}}. An LSO below the high watermark means an open transaction
is holding readers back. With --avro each value is decoded by confluent-kafka's AvroDeserializer against the schema
registry (RATCHET_REGISTRY_URL, _USER, _PASSWORD): "value" is then the decoded record and "schema_id" the id its
Confluent framing carries. With --json-schema each value is decoded (and validated against the schema its id names)
by confluent-kafka's JSONDeserializer the same way. With --protobuf each value is decoded by confluent-kafka's
ProtobufDeserializer into a message class compiled (protoc from grpcio-tools) from the schema its id names,
and printed with Protobuf's JSON mapping (json_format.MessageToDict, field names as declared, fields without
presence printed even when zero: int64 as strings, Timestamps as RFC 3339 text, Durations as "1.5s").
"""

import json
import sys
import time
import uuid

from confluent_kafka import Consumer, IsolationLevel, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec


def latest(admin: AdminClient, tps: list[TopicPartition], isolation: IsolationLevel) -> dict[int, int]:
    futures = admin.list_offsets({tp: OffsetSpec.latest() for tp in tps}, isolation_level=isolation)
    return {tp.partition: f.result(timeout=30).offset for tp, f in futures.items()}


def registry_decoder(kind: str):
    import os

    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.serialization import MessageField, SerializationContext

    registry = SchemaRegistryClient({
        "url": os.environ["RATCHET_REGISTRY_URL"],
        "basic.auth.user.info": f"{os.environ['RATCHET_REGISTRY_USER']}:{os.environ['RATCHET_REGISTRY_PASSWORD']}",
        # Bounded (the client's default is none) and retried: a registry request once hung here forever.
        "timeout": 30,
    })
    if kind == "--avro":
        from confluent_kafka.schema_registry.avro import AvroDeserializer

        deserialize = AvroDeserializer(registry)
    elif kind == "--protobuf":
        return protobuf_decoder(registry)
    else:
        from confluent_kafka.schema_registry.json_schema import JSONDeserializer

        deserialize = JSONDeserializer(None, schema_registry_client=registry)
    return lambda topic, value: deserialize(value, SerializationContext(topic, MessageField.VALUE))


def protobuf_decoder(registry):
    import base64
    import os
    import tempfile

    import grpc_tools
    from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext
    from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
    from grpc_tools import protoc

    deserializers = {}

    def files_of(schema: str) -> descriptor_pb2.FileDescriptorSet:
        """The schema (.proto text, compiled by protoc from grpcio-tools, or a base64 descriptor) and its imports."""
        try:
            file = descriptor_pb2.FileDescriptorProto.FromString(base64.standard_b64decode(schema, validate=True))
            if file.name:
                return descriptor_pb2.FileDescriptorSet(file=[file])
        except Exception:
            pass
        includes = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "schema.proto"), "w") as f:
                f.write(schema)
            out = os.path.join(tmp, "set.bin")
            if protoc.main(["protoc", f"-I{tmp}", f"-I{includes}", "--include_imports",
                            f"--descriptor_set_out={out}", os.path.join(tmp, "schema.proto")]) != 0:
                raise SystemExit(f"protoc refused the registered schema:\n{schema}")
            with open(out, "rb") as f:
                return descriptor_pb2.FileDescriptorSet.FromString(f.read())

    def deserializer(schema_id: int):
        # The writer schema by plain GET /schemas/ids/{id}: the deserializer's own lookup asks for
        # ?format=serialized, which Apicurio 3 answers with undecodable bytes (docs/services.md), so the message
        # class is built here and the deserializer reads the framing and the message with it.
        if schema_id not in deserializers:
            files = files_of(registry.get_schema(schema_id).schema_str).file
            pool = descriptor_pool.DescriptorPool()
            for file in files:
                if file.name.startswith("google/protobuf/"):
                    pool.AddSerializedFile(descriptor_pool.Default().FindFileByName(file.name).serialized_pb)
                else:
                    pool.Add(file)
            root = files[-1]
            first = pool.FindFileByName(root.name).message_types_by_name[root.message_type[0].name]
            deserializers[schema_id] = ProtobufDeserializer(message_factory.GetMessageClass(first), {})
        return deserializers[schema_id]

    def decode(topic, value):
        message = deserializer(int.from_bytes(value[1:5], "big"))(value, SerializationContext(topic, MessageField.VALUE))
        return json_format.MessageToDict(message, preserving_proto_field_name=True,
                                         always_print_fields_with_no_presence=True)

    return decode


def main(bootstrap: str, topic: str, registry_format: str = "") -> None:
    decode = registry_decoder(registry_format) if registry_format else None
    admin = AdminClient({"bootstrap.servers": bootstrap})
    meta = admin.list_topics(topic, timeout=30).topics[topic]
    if meta.error is not None:
        raise SystemExit(f"topic {topic}: {meta.error}")
    tps = [TopicPartition(topic, p) for p in sorted(meta.partitions)]
    lso = latest(admin, tps, IsolationLevel.READ_COMMITTED)
    hw = latest(admin, tps, IsolationLevel.READ_UNCOMMITTED)

    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": f"verifier-{uuid.uuid4().hex[:8]}",
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
    })
    consumer.assign([TopicPartition(topic, tp.partition, 0) for tp in tps if lso[tp.partition] > 0])
    records = []
    done = {p for p, end in lso.items() if end == 0}
    deadline = time.monotonic() + 60
    while len(done) < len(tps):
        if time.monotonic() > deadline:
            raise SystemExit(f"did not reach the LSO of every partition in 60 s: {lso}, done {done}")
        msg = consumer.poll(0.1)
        if msg is None:
            # Positions move past transaction markers without returning a message (a short poll: the last record
            # of a committed transaction is followed by its marker, so every read ends with an empty poll).
            for tp in consumer.position([TopicPartition(topic, p) for p in lso if p not in done]):
                if tp.offset >= lso[tp.partition]:
                    done.add(tp.partition)
            continue
        if msg.error():
            raise SystemExit(f"consumer error: {msg.error()}")
        record = {
            "partition": msg.partition(),
            "offset": msg.offset(),
            "key": msg.key().decode("utf-8", "replace") if msg.key() is not None else None,
            "value": msg.value().decode("utf-8", "replace") if msg.value() is not None else None,
            "headers": {k: (v.decode("utf-8", "replace") if v is not None else None) for k, v in (msg.headers() or [])},
        }
        if decode is not None and msg.value() is not None:
            record["value"] = decode(topic, msg.value())
            record["schema_id"] = int.from_bytes(msg.value()[1:5], "big")
        records.append(record)
        if msg.offset() + 1 >= lso[msg.partition()]:
            done.add(msg.partition())
    consumer.close()
    json.dump({
        "records": records,
        "partitions": {p: {"lso": lso[p], "high_watermark": hw[p]} for p in lso},
    }, sys.stdout)


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4) or sys.argv[3:] not in ([], ["--avro"], ["--json-schema"], ["--protobuf"]):
        raise SystemExit(__doc__)
    main(*sys.argv[1:])
