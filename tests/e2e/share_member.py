"""A share consumer in its own process (so a test can kill -9 it): subscribes GROUP to
TOPIC in explicit acknowledgement mode, prints `offset delivery_count` of the first records
it receives (flushed at once) and then holds them, never acknowledging, until it is killed
(at most HOLD_S).

    PYTHONPATH=REPO python share_member.py BOOTSTRAP GROUP TOPIC
"""

from __future__ import annotations

import sys
import time

from tests.support.share import share_consumer

HOLD_S = 300


def main() -> None:
    bootstrap, group, topic = sys.argv[1:4]
    consumer = share_consumer(bootstrap, group, topic, max_records=5)
    deadline = time.monotonic() + HOLD_S
    got = []
    while not got and time.monotonic() < deadline:
        got = [m for m in consumer.poll(1.0) if m.error() is None]
    for m in got:
        print(m.offset(), m.delivery_count(), flush=True)
    print("holding", flush=True)
    while time.monotonic() < deadline:  # heartbeats go on in librdkafka's threads
        time.sleep(1)


if __name__ == "__main__":
    main()
