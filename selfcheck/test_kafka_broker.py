"""Broker self-check: proves the real Kafka broker does what ratchet's Kafka sink relies on.

Every check reads the result with an independent read_committed consumer (confluent-kafka, i.e. librdkafka's own
client, not ratchet code). Where a check must show that something is *not* visible, it commits a sentinel record
after the transaction under test and reads up to that sentinel: a read_committed reader only returns the sentinel once
every transaction before it is decided, so "not seen before the sentinel" is a proof, not a timing guess.

1. commit / abort: committed records are visible, aborted ones are not (but were written).
2. zombie fencing: a second producer with the same transactional.id fences the first.
3. orphaned transaction: a producer killed with SIGKILL mid-transaction holds the last stable offset (LSO) back
   until a new producer with that transactional.id calls init_transactions, which aborts it.
4. offsets in a transaction: send_offsets_to_transaction commits the consumer offsets with the transaction, and
   not at all when the transaction aborts.
5. transaction timeout: a transaction older than its transaction.timeout.ms is aborted by the broker.
"""

import subprocess
import sys
import time
import uuid

import pytest
from confluent_kafka import Consumer, IsolationLevel, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

DEADLINE_S = 60


def txn_producer(bootstrap: str, tid: str, **extra) -> Producer:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": tid,
            "enable.idempotence": True,
            "acks": "all",
            "transaction.timeout.ms": 60000,
            **extra,
        }
    )
    producer.init_transactions(30)
    return producer


def new_tid() -> str:
    return f"selfcheck-{uuid.uuid4().hex[:10]}"


def read_until(bootstrap: str, topic: str, sentinel: bytes, isolation: str = "read_committed") -> list[bytes]:
    """All values of `topic` (partition 0) from the start up to and including `sentinel`, as `isolation` sees them."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"selfcheck-reader-{uuid.uuid4().hex[:8]}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    values: list[bytes] = []
    deadline = time.monotonic() + DEADLINE_S
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                raise KafkaException(msg.error())
            values.append(msg.value())
            if msg.value() == sentinel:
                return values
    finally:
        consumer.close()
    pytest.fail(f"{isolation} reader did not reach sentinel {sentinel!r} on {topic} in {DEADLINE_S}s; saw {values}")


def offsets(bootstrap: str, topic: str, isolation: IsolationLevel) -> int:
    """Latest offset of partition 0: the high watermark (read_uncommitted) or the LSO (read_committed)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    tp = TopicPartition(topic, 0)
    result = admin.list_offsets({tp: OffsetSpec.latest()}, isolation_level=isolation, request_timeout=10)
    return result[tp].result(timeout=15).offset


def commit_sentinel(bootstrap: str, topic: str) -> bytes:
    """Commit one record with a fresh transactional producer and return its value."""
    sentinel = f"sentinel-{uuid.uuid4().hex[:8]}".encode()
    producer = txn_producer(bootstrap, new_tid())
    producer.begin_transaction()
    producer.produce(topic, sentinel, partition=0)
    producer.commit_transaction(30)
    return sentinel


def test_commit_and_abort_with_read_committed(bootstrap: str, topic: str) -> None:
    producer = txn_producer(bootstrap, new_tid())
    producer.begin_transaction()
    producer.produce(topic, b"committed-1", partition=0)
    producer.produce(topic, b"committed-2", partition=0)
    producer.commit_transaction(30)

    producer.begin_transaction()
    producer.produce(topic, b"aborted-1", partition=0)
    producer.produce(topic, b"aborted-2", partition=0)
    producer.flush(30)  # librdkafka drops (does not abort) unsent records on abort: flush first
    producer.abort_transaction(30)

    producer.begin_transaction()
    producer.produce(topic, b"committed-3", partition=0)
    producer.commit_transaction(30)

    assert read_until(bootstrap, topic, b"committed-3") == [b"committed-1", b"committed-2", b"committed-3"]
    # The aborted records did reach the log: read_uncommitted sees them, so the check above is meaningful.
    uncommitted = read_until(bootstrap, topic, b"committed-3", isolation="read_uncommitted")
    assert b"aborted-1" in uncommitted and b"aborted-2" in uncommitted


def test_zombie_producer_is_fenced(bootstrap: str, topic: str) -> None:
    tid = new_tid()
    zombie = txn_producer(bootstrap, tid)
    zombie.begin_transaction()
    zombie.produce(topic, b"zombie", partition=0)
    zombie.flush(30)

    successor = txn_producer(bootstrap, tid)  # bumps the epoch: the zombie's transaction is aborted

    with pytest.raises(KafkaException) as fenced:
        zombie.commit_transaction(30)
    error: KafkaError = fenced.value.args[0]
    assert error.fatal() or error.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED,
                                             KafkaError.INVALID_PRODUCER_EPOCH), error

    successor.begin_transaction()
    successor.produce(topic, b"successor", partition=0)
    successor.commit_transaction(30)
    assert read_until(bootstrap, topic, b"successor") == [b"successor"]


ORPHAN_CHILD = """
import sys
from confluent_kafka import Producer
bootstrap, tid, topic = sys.argv[1:4]
p = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, "transaction.timeout.ms": 600000})
p.init_transactions(30)
p.begin_transaction()
p.produce(topic, b"orphan", partition=0)
p.flush(30)
print("in-transaction", flush=True)
sys.stdin.read()  # wait to be killed
"""


def test_orphaned_transaction_is_aborted_on_reinit(bootstrap: str, topic: str) -> None:
    tid = new_tid()
    child = subprocess.Popen(
        [sys.executable, "-c", ORPHAN_CHILD, bootstrap, tid, topic],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert child.stdout.readline().strip() == "in-transaction"
    finally:
        child.kill()  # SIGKILL: no abort, no clean close
        child.wait()

    # The orphan holds the LSO at its first record while the high watermark is past it.
    assert offsets(bootstrap, topic, IsolationLevel.READ_UNCOMMITTED) == 1
    assert offsets(bootstrap, topic, IsolationLevel.READ_COMMITTED) == 0

    successor = txn_producer(bootstrap, tid)  # init_transactions aborts the orphaned transaction
    successor.begin_transaction()
    successor.produce(topic, b"after-orphan", partition=0)
    successor.commit_transaction(30)

    assert read_until(bootstrap, topic, b"after-orphan") == [b"after-orphan"]
    assert offsets(bootstrap, topic, IsolationLevel.READ_COMMITTED) == offsets(
        bootstrap, topic, IsolationLevel.READ_UNCOMMITTED
    )


def _consume_all(bootstrap: str, topic: str, group: str, expected: int) -> Consumer:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
    )
    consumer.subscribe([topic])
    seen = 0
    deadline = time.monotonic() + DEADLINE_S
    while seen < expected and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and not msg.error():
            seen += 1
    assert seen == expected, f"consumed {seen} of {expected} records from {topic}"
    return consumer


def _committed_offset(bootstrap: str, topic: str, group: str) -> int:
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        return reader.committed([TopicPartition(topic, 0)], timeout=15)[0].offset
    finally:
        reader.close()


@pytest.mark.parametrize("outcome", ["commit", "abort"])
def test_offsets_commit_with_the_transaction(bootstrap: str, topic: str, outcome: str) -> None:
    plain = Producer({"bootstrap.servers": bootstrap})
    for i in range(3):
        plain.produce(topic, f"in-{i}".encode(), partition=0)
    plain.flush(30)

    group = f"selfcheck-group-{uuid.uuid4().hex[:8]}"
    consumer = _consume_all(bootstrap, topic, group, expected=3)
    producer = txn_producer(bootstrap, new_tid())
    producer.begin_transaction()
    producer.produce(topic, b"out", partition=0)
    producer.send_offsets_to_transaction(
        [TopicPartition(topic, 0, 3)], consumer.consumer_group_metadata(), 30
    )
    if outcome == "commit":
        producer.commit_transaction(30)
    else:
        producer.flush(30)
        producer.abort_transaction(30)
    consumer.close()

    committed = _committed_offset(bootstrap, topic, group)
    if outcome == "commit":
        assert committed == 3
    else:
        assert committed < 0, f"an aborted transaction committed offset {committed}"


def test_transaction_older_than_its_timeout_is_aborted_by_broker(bootstrap: str, topic: str) -> None:
    timeout_ms = 2000
    stale = txn_producer(bootstrap, new_tid(), **{"transaction.timeout.ms": timeout_ms})
    stale.begin_transaction()
    stale.produce(topic, b"expired", partition=0)
    stale.flush(30)
    started = time.monotonic()

    # The sentinel sits behind the open transaction: read_committed returns it only once the broker has
    # decided that transaction, and nobody but the broker's timeout will decide it.
    sentinel = commit_sentinel(bootstrap, topic)
    assert read_until(bootstrap, topic, sentinel) == [sentinel]
    assert time.monotonic() - started >= timeout_ms / 1000 * 0.9

    assert b"expired" in read_until(bootstrap, topic, sentinel, isolation="read_uncommitted")
    with pytest.raises(KafkaException):
        stale.commit_transaction(30)  # the broker bumped the epoch when it aborted: this producer is fenced
