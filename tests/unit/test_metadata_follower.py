"""The broker's metadata follower hands every listener what each batch changed (the
`MetadataDelta`) and the new image; after a snapshot, None: anything may have changed."""

from __future__ import annotations

from controlplane.image import MetadataImage
from controlplane.records import TopicRecord, encode_record
from dataplane.broker.metadata import MetadataFollower


class _Controller:
    """A log of two topic records, after a snapshot of an empty image on the first read."""

    def __init__(self) -> None:
        self.reads = 0

    def read_log(self, after_offset: int, max_records: int, wait_ms: int) -> dict:
        self.reads += 1
        records = [
            {"offset": 1, "record": encode_record(TopicRecord(topic_id="a", name="ta"))},
            {"offset": 2, "record": encode_record(TopicRecord(topic_id="b", name="tb"))},
        ]
        if self.reads == 1:
            return {
                "snapshot": MetadataImage().model_dump(mode="json"),
                "snapshot_offset": 0,
                "records": [],
                "next_offset": 3,
            }
        return {"records": [r for r in records if r["offset"] > after_offset], "next_offset": 3}


def test_listeners_get_the_delta_and_the_new_image_in_order() -> None:
    seen: list[tuple[str, object, int]] = []
    follower = MetadataFollower(
        _Controller(),  # type: ignore[arg-type]
        listeners=[lambda delta, image: seen.append(("first", delta, image.offset))],
    )
    follower.subscribe(lambda delta, image: seen.append(("second", delta, image.offset)))
    assert follower.poll_once() == 0  # the snapshot: no delta
    assert seen == [("first", None, 0), ("second", None, 0)]
    seen.clear()
    assert follower.poll_once() == 2
    assert [(name, offset) for name, _, offset in seen] == [("first", 2), ("second", 2)]
    delta = seen[0][1]
    assert delta is seen[1][1] and delta.touched["topics"] == {"a", "b"}
    assert delta.image is follower.image and [r.topic_id for r in delta.records] == ["a", "b"]
    seen.clear()
    assert follower.poll_once() == 0 and seen == []  # nothing new: nobody is called
