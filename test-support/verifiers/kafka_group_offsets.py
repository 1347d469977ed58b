"""Independent verifier: the committed offsets of a Kafka consumer group and its state, as the tools operators use
read them (confluent-kafka's AdminClient: the same ListConsumerGroupOffsets / DescribeConsumerGroups requests as
kafka-consumer-groups.sh --describe), as JSON.

usage: kafka_group_offsets.py BOOTSTRAP GROUP

Prints {"offsets": {"<topic>/<partition>": offset, ...}, "state": "Empty" | "Stable" | ..., "members": n,
"assignment": {"<group.instance.id or client id>": [partition, ...], ...}} (the assignment as --describe --members
--verbose shows it).
"""

import json
import sys

from confluent_kafka import ConsumerGroupTopicPartitions
from confluent_kafka.admin import AdminClient


def main(bootstrap: str, group: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    listed = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(timeout=30)
    offsets = {
        f"{tp.topic}/{tp.partition}": tp.offset for tp in listed.topic_partitions if tp.offset >= 0
    }
    described = admin.describe_consumer_groups([group])[group].result(timeout=30)
    assignment = {
        (member.group_instance_id or member.client_id): sorted(
            tp.partition for tp in (member.assignment.topic_partitions if member.assignment else [])
        )
        for member in described.members
    }
    print(
        json.dumps(
            {
                "offsets": offsets,
                "state": str(described.state.name),
                "members": len(described.members),
                "assignment": assignment,
            }
        )
    )


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    main(*sys.argv[1:])
