"""`automqctl group describe` shows a KIP-848 group's epochs (group, assignment, each
member's): the CLI asks the group's coordinator with ConsumerGroupDescribe (69) itself
(librdkafka's describe_consumer_groups does not hand them out), through the path share
groups use (FindCoordinator, then the coordinator). Here a loopback server answers with the
broker's real ConsumerGroupDescribe handler."""

from __future__ import annotations

import asyncio
import socket
import struct
import threading

from kafka.protocol.metadata import FindCoordinatorResponse, MetadataResponse

from cli.share_group import ShareDescribeError, consumer_group_epochs
from dataplane.kafka.codec import decode_request, encode_response
from tests.unit.test_consumer_group_handlers import heartbeat, make
from tests.unit.test_group_handlers import Ctx, call

MAX_REQUESTS = 20


class Coordinator:
    """A loopback 'broker' (its own thread) answering FindCoordinator with itself, Metadata
    with no brokers and ConsumerGroupDescribe with the real handler; stops on close()."""

    def __init__(self, describe) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(10)
        self.port = self.listener.getsockname()[1]
        self.describe = describe
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _answer(self, request):
        if request.api_key == 10:
            C = FindCoordinatorResponse[4].Coordinator
            found = C(key="g", node_id=1, host="127.0.0.1", port=self.port, error_code=0)
            return FindCoordinatorResponse[4](throttle_time_ms=0, coordinators=[found])
        if request.api_key == 3:
            return MetadataResponse[1](brokers=[], controller_id=1, topics=[])
        return asyncio.run(self.describe(request.body, Ctx(request.api_version)))

    def _serve(self) -> None:
        for _ in range(MAX_REQUESTS):
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                size = struct.unpack(">i", conn.recv(4, socket.MSG_WAITALL))[0]
                request = decode_request(conn.recv(size, socket.MSG_WAITALL))
                conn.sendall(bytes(encode_response(request, self._answer(request))))

    def close(self) -> None:
        self.listener.close()
        self.thread.join(10)


def test_a_consumer_groups_epochs_come_from_consumer_group_describe():
    _, by_key = make()
    asyncio.run(call(by_key[68], heartbeat(member_id="m1")))
    asyncio.run(call(by_key[68], heartbeat(member_id="m2")))
    server = Coordinator(by_key[69])
    try:
        epochs = consumer_group_epochs(f"127.0.0.1:{server.port}", "cg", None)
        assert epochs is not None
        assert epochs["group_epoch"] == 2 and epochs["assignment_epoch"] == 2
        assert set(epochs["member_epochs"]) == {"m1", "m2"}
        assert epochs["member_epochs"]["m2"] == 2
        # a group the consumer protocol does not know (a classic one): no epochs
        assert consumer_group_epochs(f"127.0.0.1:{server.port}", "classic", None) is None
    finally:
        server.close()


def test_epochs_are_not_asked_over_sasl():
    sasl = {"security_protocol": "SASL_PLAINTEXT"}
    try:
        consumer_group_epochs("127.0.0.1:1", "cg", sasl)
    except ShareDescribeError as exc:
        assert "PLAINTEXT or SSL" in str(exc)
    else:
        raise AssertionError("SASL is not spoken here")
