"""A produce that stopped waiting for durability (its timeout) leaves no "Future exception
was never retrieved" ERROR when the append fails later (a fenced WAL: issue 33)."""

from __future__ import annotations

import asyncio
import gc
from concurrent.futures import Future

from dataplane.kafka.data_apis import _outcome_retrieved
from dataplane.s3stream.wal import WALFencedError


def _unretrieved_after_timeout(wrap) -> list[dict]:
    reported: list[dict] = []

    async def scenario() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: reported.append(ctx))
        durable: Future = Future()
        try:
            await asyncio.wait_for(asyncio.shield(wrap(asyncio.wrap_future(durable))), 0.01)
        except TimeoutError:
            pass
        durable.set_exception(WALFencedError("owned by node 2 epoch 4"))
        for _ in range(5):
            await asyncio.sleep(0)
        gc.collect()

    asyncio.run(scenario())
    return [c for c in reported if "never retrieved" in c.get("message", "")]


def test_a_late_failure_of_an_abandoned_wait_is_retrieved() -> None:
    assert _unretrieved_after_timeout(_outcome_retrieved) == []


def test_without_it_asyncio_reports_the_exception() -> None:
    """The scenario reproduces the ERROR the fix removes."""
    assert _unretrieved_after_timeout(lambda f: f)
