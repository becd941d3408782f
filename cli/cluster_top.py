"""`automqctl cluster top`: a live view of a local cluster (brokers' traffic, latency, WAL and
uploads, topics' rates and consumer lag, failover mode and active bucket), or one sample for
scripts (`--once --format json`). Reading is `cli.top_collect`, arithmetic `cli.top_metrics`,
drawing `cli.top_view`."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import typer

from cli.options import DirOption, open_cluster
from cli.output import OutputFormat, console, fail, print_data
from cli.top_collect import TopSampler
from cli.top_view import render, run_live


def top_command(
    dir: Path = DirOption,
    interval_s: float = typer.Option(
        2.0,
        "--interval-s",
        min=0.2,
        max=3600,
        help="seconds between refreshes; with --once, between the sample's two scrapes",
    ),
    once: bool = typer.Option(
        False, "--once", help="print one sample (two scrapes --interval-s apart) and exit"
    ),
    format: OutputFormat = typer.Option(OutputFormat.table, "--format"),
) -> None:
    """A live view of the cluster, refreshed every --interval-s (q or Ctrl-C quits): per
    broker produce/fetch MB/s, request and produce p99, WAL fill, upload lag and errors,
    partitions led, connections; per topic MB/s in/out and consumer-group lag; the failover
    mode and the active bucket. Rates come from two scrapes of the brokers' /metrics.
    --format json|yaml prints documents instead (one JSON line per refresh); with --once,
    exit code 1 when no broker's /metrics answered."""
    cluster, config = open_cluster(dir)
    if not any(spec.metrics_port for spec in config.brokers):
        fail(f"the brokers of {dir} have no metrics port (a cluster made before they had one)")
    sampler = TopSampler(cluster, config, interval_s)
    try:
        if once:
            doc = sampler.once()
            _print(doc, format)
            if all(b.get("error") for b in doc["brokers"]):
                raise typer.Exit(1)
            return
        sampler.prime()
        if format == OutputFormat.table and console.is_terminal:
            run_live(console, sampler.sample, interval_s, f"reading {dir} ...")
            return
        while True:
            started = time.monotonic()
            doc = sampler.sample()
            _print(doc, format, stream=True)
            time.sleep(max(0.0, interval_s - (time.monotonic() - started)))
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    finally:
        sampler.close()


def _print(doc: dict, format: OutputFormat, stream: bool = False) -> None:
    """One document: a table, JSON (one line per document when streaming) or YAML."""
    if format == OutputFormat.json and stream:
        sys.stdout.write(json.dumps(doc) + "\n")
    elif format == OutputFormat.yaml and stream:
        sys.stdout.write("---\n")  # a YAML stream: one document per refresh
        print_data(doc, format)
    elif not print_data(doc, format):
        console.print(render(doc))
    sys.stdout.flush()
