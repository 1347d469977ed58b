"""Shared fixtures for the service self-checks: endpoints come from `scripts/services.sh env`."""

import os
import subprocess
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _service_env() -> dict[str, str]:
    """The RATCHET_* endpoints: from the environment, else from `scripts/services.sh env`."""
    if "RATCHET_KAFKA_BOOTSTRAP" in os.environ:
        return dict(os.environ)
    out = subprocess.run(
        [str(ROOT / "scripts" / "services.sh"), "env"], check=True, capture_output=True, text=True
    ).stdout
    env = dict(os.environ)
    for line in out.splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        env[key] = value
    return env


@pytest.fixture(scope="session")
def bootstrap() -> str:
    """Bootstrap address of the real Kafka broker; fails (never skips) when it does not answer."""
    from confluent_kafka.admin import AdminClient

    address = _service_env()["RATCHET_KAFKA_BOOTSTRAP"]
    admin = AdminClient({"bootstrap.servers": address})
    try:
        admin.describe_cluster(request_timeout=5).result(timeout=10)
    except Exception as e:  # noqa: BLE001 - turned into an actionable failure
        pytest.fail(f"Kafka at {address} does not answer ({e}); start it with `scripts/services.sh up`")
    return address


@pytest.fixture
def topic(bootstrap: str) -> str:
    """A fresh single-partition topic."""
    from confluent_kafka.admin import AdminClient, NewTopic

    name = f"selfcheck-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, num_partitions=1, replication_factor=1)])[name].result(timeout=30)
    return name
