"""Schema registry self-check: the registry in the test services speaks the Confluent Schema Registry API the way
the real client libraries expect (confluent-kafka's SchemaRegistryClient and AvroSerializer, not Ratchet code).

1. basic auth is on: without credentials the API answers 401.
2. a producer's AvroSerializer registers the value schema under `<topic>-value` (TopicNameStrategy) and frames each
   value in the Confluent wire format: 0x00, the 4-byte big-endian schema id, the Avro body.
3. a compatible change (an optional field with a default) gets a new id and version; `GET /schemas/ids/<id>`
   returns each schema, and the default compatibility is BACKWARD, so an incompatible change is refused (409).
"""

import json
import urllib.error
import urllib.request
import uuid

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext

from conftest import _service_env


def order_schema(*extra: dict) -> str:
    fields = [{"name": "id", "type": "long"}, {"name": "note", "type": ["null", "string"], "default": None}]
    return json.dumps({"type": "record", "name": "Order", "namespace": "ratchet.selfcheck", "fields": fields + list(extra)})


def client_of(url: str, user_info: str) -> SchemaRegistryClient:
    """A client whose every request is bounded (the library's default is no timeout) and so retried: a request
    on a kept-alive connection once got no answer until the registry's 30-minute idle timeout closed it."""
    return SchemaRegistryClient({"url": url, "basic.auth.user.info": user_info, "timeout": 30})


@pytest.fixture(scope="module")
def registry() -> tuple[str, str]:
    """The registry's Confluent API base URL and `user:password`; fails (never skips) when it does not answer."""
    env = _service_env()
    url, user_info = env["RATCHET_REGISTRY_URL"], f"{env['RATCHET_REGISTRY_USER']}:{env['RATCHET_REGISTRY_PASSWORD']}"
    try:
        client_of(url, user_info).get_subjects()
    except Exception as e:  # noqa: BLE001 - turned into an actionable failure
        pytest.fail(f"the schema registry at {url} does not answer ({e}); start it with `scripts/services.sh up`")
    return url, user_info


def test_the_api_needs_credentials(registry):
    url, _ = registry
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{url}/subjects", timeout=10)
    assert refused.value.code == 401


def test_values_are_framed_with_the_registered_id_and_evolve_compatibly(registry):
    url, user_info = registry
    client = client_of(url, user_info)
    topic = f"selfcheck-{uuid.uuid4().hex[:8]}"
    context = SerializationContext(topic, MessageField.VALUE)

    first = AvroSerializer(client, order_schema())({"id": 42, "note": "hello"}, context)
    first_id = int.from_bytes(first[1:5], "big")
    assert first[0] == 0 and first_id > 0
    assert client.get_latest_version(f"{topic}-value").schema_id == first_id

    added = order_schema({"name": "qty", "type": ["null", "int"], "default": None})
    second = AvroSerializer(client, added)({"id": 43, "note": None, "qty": 7}, context)
    second_id = int.from_bytes(second[1:5], "big")
    assert second_id != first_id
    assert client.get_versions(f"{topic}-value") == [1, 2]
    for schema_id, text in [(first_id, order_schema()), (second_id, added)]:
        assert json.loads(client.get_schema(schema_id).schema_str) == json.loads(text)

    decode = AvroDeserializer(client)
    assert decode(first, context) == {"id": 42, "note": "hello"}
    assert decode(second, context) == {"id": 43, "note": None, "qty": 7}

    assert client.get_compatibility() == "BACKWARD"
    narrowed = order_schema({"name": "required", "type": "int"})
    with pytest.raises(SchemaRegistryError) as refused:
        client.register_schema(f"{topic}-value", Schema(narrowed, "AVRO"))
    assert refused.value.http_status_code == 409
