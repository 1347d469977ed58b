"""Producer peer: writes records to Kafka as an application of the Confluent ecosystem does, with confluent-kafka's
SchemaRegistryClient and ProtobufSerializer (the schema registered under <topic>-value, values in the Confluent wire
format: 0x00, the 4-byte schema id, the message-index path, the message). No Ratchet code and no hand-framed bytes.

usage: confluent_protobuf.py [--compatibility=LEVEL] BOOTSTRAP TOPIC PROTO MESSAGE RECORDS [IMPORTS [KEY_MESSAGE]]

PROTO is the text of one .proto file (`order.proto`); it may import google/protobuf/*.proto and the files IMPORTS
(a JSON object of file name to .proto text) holds. It is compiled by protoc from grpcio-tools into a message class,
as an application's generated code would be; the serializer registers each imported file under its own subject (its
file name) and the schema with references to them. MESSAGE is the full name of the
message to write; RECORDS a JSON list of objects in Protobuf's JSON mapping (Timestamps as RFC 3339 text, enums by
name, bytes as base64), each parsed into the message by google.protobuf.json_format and keyed by its `id` field,
when it has one, as text; with KEY_MESSAGE (a message of the same file) the key is that message holding the `id`
instead, written by a ProtobufSerializer for keys (subject <topic>-key, its message-index path naming the key
message). The registry is RATCHET_REGISTRY_URL with RATCHET_REGISTRY_USER /
RATCHET_REGISTRY_PASSWORD. Every record is acknowledged before the script ends. Prints {"schema_id": the id the
values carry, "count": records written}. With --compatibility, the subject <topic>-value's compatibility is set to
LEVEL first (NONE lets a test register a change the registry's BACKWARD default refuses, such as int32 to int64,
which Apicurio's Protobuf rule calls a changed field type).
"""

import json
import os
import sys
import tempfile

import grpc_tools
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from grpc_tools import protoc

from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext


def message_class(proto: str, message: str, imports: dict[str, str]):
    """The class of `message` in the .proto text `proto` (importing `imports`), compiled by protoc (grpcio-tools)
    in a fresh pool."""
    includes = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in imports.items():
            os.makedirs(os.path.dirname(os.path.join(tmp, name)), exist_ok=True)
            with open(os.path.join(tmp, name), "w") as f:
                f.write(text)
        source = os.path.join(tmp, "order.proto")
        with open(source, "w") as f:
            f.write(proto)
        descriptors = os.path.join(tmp, "set.bin")
        if protoc.main(["protoc", f"-I{tmp}", f"-I{includes}", "--include_imports",
                        f"--descriptor_set_out={descriptors}", source]) != 0:
            raise SystemExit("protoc refused the schema (its errors are above)")
        with open(descriptors, "rb") as f:
            files = descriptor_pb2.FileDescriptorSet.FromString(f.read())
    pool = descriptor_pool.DescriptorPool()
    for file in files.file:
        pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(message))


def main(bootstrap: str, topic: str, proto: str, message: str, records: str, imports: str = "{}",
         key_message: str = "", compatibility: str = "") -> None:
    registry = SchemaRegistryClient({
        "url": os.environ["RATCHET_REGISTRY_URL"],
        "basic.auth.user.info": f"{os.environ['RATCHET_REGISTRY_USER']}:{os.environ['RATCHET_REGISTRY_PASSWORD']}",
        # Bounded (the client's default is none) and retried: a registry request once hung here forever.
        "timeout": 30,
    })
    if compatibility:
        registry.set_compatibility(f"{topic}-value", compatibility)
    cls = message_class(proto, message, json.loads(imports))
    serialize = ProtobufSerializer(cls, registry, {"use.deprecated.format": False})
    key_cls = None
    if key_message:
        key_cls = message_factory.GetMessageClass(cls.DESCRIPTOR.file.pool.FindMessageTypeByName(key_message))
        serialize_key = ProtobufSerializer(key_cls, registry, {"use.deprecated.format": False})
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    failures = []
    schema_ids = set()

    def delivered(err, _msg):
        if err is not None:
            failures.append(str(err))

    context = SerializationContext(topic, MessageField.VALUE)
    rows = json.loads(records)
    for row in rows:
        value = serialize(json_format.ParseDict(row, cls()), context)
        schema_ids.add(int.from_bytes(value[1:5], "big"))
        if key_cls is not None:
            key = serialize_key(json_format.ParseDict({"id": row["id"]}, key_cls()),
                                SerializationContext(topic, MessageField.KEY))
        else:
            key = str(row["id"]).encode() if "id" in row else None
        producer.produce(topic, key=key, value=value, on_delivery=delivered)
        producer.poll(0)
    if producer.flush(30) != 0 or failures:
        raise SystemExit(f"not every record was acknowledged: {failures or 'flush timed out'}")
    if len(schema_ids) > 1:
        raise SystemExit(f"one schema, one id expected; the values carry {sorted(schema_ids)}")
    print(json.dumps({"schema_id": schema_ids.pop() if schema_ids else None, "count": len(rows)}))


if __name__ == "__main__":
    flags = [a for a in sys.argv[1:] if a.startswith("--compatibility=")]
    positional = [a for a in sys.argv[1:] if not a.startswith("--compatibility=")]
    main(*positional, compatibility=flags[-1].split("=", 1)[1] if flags else "")
