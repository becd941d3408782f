"""The broker process: arguments, logging, signals, and the re-exec of a process fenced for
good (its WAL was taken over: a fresh process registers with a new epoch and recovers from
a clean state).

Run: python -m dataplane.broker --config broker.json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from controlplane.signal_watcher import SignalWatcher
from dataplane.broker.assembly import Broker
from dataplane.config import BrokerConfig
from dataplane.runtime import (
    freeze_startup_heap,
    install_gc_pause_metric,
    keep_freed_memory,
    set_gil_switch_interval,
)

log = logging.getLogger("dataplane.broker")

# the module a broker process runs as (the CLI starts it so; a fenced process re-execs it)
BROKER_MODULE = "dataplane.broker"
POLL_S = 0.2  # how often the main thread looks at the stop signal and the restart request


def main(argv: list[str] | None = None) -> int:
    """Run one broker until SIGTERM / SIGINT (controlled shutdown), re-exec'ing the process
    if it is fenced for good."""
    parser = argparse.ArgumentParser(description="automq broker")
    parser.add_argument("--config", required=True, type=Path)
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    config = BrokerConfig.model_validate(json.loads(args.config.read_text()))
    install_gc_pause_metric()
    keep_freed_memory()
    set_gil_switch_interval(config.gil_switch_interval_ms)
    broker = Broker(config)
    stop = SignalWatcher.install().stop_event
    broker.start()
    freeze_startup_heap()
    while not stop.wait(POLL_S):
        if broker.restart_requested.is_set():
            # our WAL was taken over: nothing of this process may write any more; a new
            # process (same pid, same arguments) registers with a new epoch
            logging.shutdown()
            os.execv(sys.executable, [sys.executable, "-m", BROKER_MODULE, *sys.argv[1:]])
    log.info("broker %d stopping", config.node_id)
    broker.stop()
    return 0
