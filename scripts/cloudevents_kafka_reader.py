#!/usr/bin/env python3
"""Reads every message of a Kafka topic with confluent-kafka and decodes each with the official
CloudEvents Python SDK's Kafka binding (`cloudevents.core.bindings.kafka.from_kafka_event`, which
picks structured or binary mode by itself), printing one JSON line per event: its attributes,
data, and the Kafka key. Used by the Kafka transport's interoperability test; no custom decoding.

usage: cloudevents_kafka_reader.py BOOTSTRAP TOPIC COUNT
"""

import json
import sys
import time

from cloudevents.core.bindings import kafka
from confluent_kafka import Consumer, TopicPartition


def main() -> int:
    bootstrap, topic, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "cloudevents-sdk-reader",
            "enable.auto.commit": False,
        }
    )
    metadata = consumer.list_topics(topic, timeout=10)
    partitions = metadata.topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    seen = 0
    deadline = time.time() + 30
    while seen < count and time.time() < deadline:
        message = consumer.poll(0.5)
        if message is None or message.error():
            continue
        headers = {name: value for name, value in (message.headers() or [])}
        event = kafka.from_kafka_event(
            kafka.KafkaMessage(headers=headers, key=message.key(), value=message.value())
        )
        attributes = {
            name: (value.isoformat() if hasattr(value, "isoformat") else value)
            for name, value in event.get_attributes().items()
        }
        print(
            json.dumps(
                {
                    "attributes": attributes,
                    "data": event.get_data(),
                    "key": message.key().decode() if message.key() else None,
                }
            ),
            flush=True,
        )
        seen += 1
    consumer.close()
    return 0 if seen == count else 1


if __name__ == "__main__":
    sys.exit(main())
