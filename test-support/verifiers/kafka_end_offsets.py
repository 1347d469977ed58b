"""Independent verifier: the end offset (high watermark) of every partition of a Kafka topic, as the tools operators
use read it (confluent-kafka's AdminClient ListOffsets, latest), as JSON.

usage: kafka_end_offsets.py BOOTSTRAP TOPIC

Prints {"<partition>": end_offset, ...}.
"""

import json
import sys

from confluent_kafka import TopicPartition
from confluent_kafka.admin import OffsetSpec
from confluent_kafka.admin import AdminClient


def main(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    metadata = admin.list_topics(topic, timeout=30)
    partitions = sorted(metadata.topics[topic].partitions)
    request = {TopicPartition(topic, p): OffsetSpec.latest() for p in partitions}
    listed = admin.list_offsets(request, request_timeout=30)
    ends = {str(tp.partition): future.result(timeout=30).offset for tp, future in listed.items()}
    print(json.dumps(ends))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    main(*sys.argv[1:])
