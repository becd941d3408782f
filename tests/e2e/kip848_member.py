"""One confluent-kafka consumer with `group.protocol=consumer` (KIP-848), run as a subprocess
by test_kip848_groups.py so that it can be kill -9'd: it appends to its output file, flushed
line by line, `R <partition> <offset> <time s>` for every record and `C <partition> <offset>
<time s>` once that offset (the next to read) is committed; `A <epoch ms>` at its first record.

Usage: python -m tests.e2e.kip848_member BOOTSTRAP GROUP TOPIC OUTFILE
"""

from __future__ import annotations

import signal
import sys
import time

from confluent_kafka import Consumer, KafkaException, TopicPartition


def main() -> None:
    bootstrap, group, topic, out_path = sys.argv[1:5]
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "group.protocol": "consumer",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 100,
        }
    )
    consumer.subscribe([topic])
    first = True
    with open(out_path, "a", buffering=1) as out:
        while not stop:
            batch = consumer.consume(100, 0.5)
            done: dict[int, int] = {}
            for msg in batch:
                if msg.error():
                    continue
                if first:
                    out.write(f"A {int(time.time() * 1000)}\n")
                    first = False
                out.write(f"R {msg.partition()} {msg.offset()} {time.time():.3f}\n")
                done[msg.partition()] = msg.offset() + 1
            if done:
                try:
                    consumer.commit(
                        offsets=[TopicPartition(topic, p, o) for p, o in done.items()],
                        asynchronous=False,
                    )
                    for p, o in done.items():
                        out.write(f"C {p} {o} {time.time():.3f}\n")
                except KafkaException as exc:
                    out.write(f"E {exc}\n")
    consumer.close()


if __name__ == "__main__":
    main()
