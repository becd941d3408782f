"""Configuration of controller processes (pydantic; written by `automqctl cluster up`)."""

from __future__ import annotations

from urllib.parse import quote

from pydantic import BaseModel, Field

from controlplane.settings import BalancerSettings, ControllerSettings


class ControllerAddress(BaseModel):
    node_id: int
    host: str = "127.0.0.1"
    raft_port: int
    api_port: int

    @property
    def raft_address(self) -> str:
        return f"{self.host}:{self.raft_port}"

    @property
    def api_address(self) -> str:
        return f"{self.host}:{self.api_port}"


class BucketConfig(BaseModel):
    """One bucket of the object store. Secrets stay in the cluster directory (mode 0600)."""

    bucket_id: int
    uri: str  # e.g. 0@s3://automq-main?region=us-east-1&endpoint=http://127.0.0.1:8333
    access_key: str = ""
    secret_key: str = ""

    def uri_with_credentials(self) -> str:
        """The URI with accessKey/secretKey in its query (for the object-store client only)."""
        if not self.access_key:
            return self.uri
        sep = "&" if "?" in self.uri else "?"
        return (
            f"{self.uri}{sep}accessKey={quote(self.access_key, safe='')}"
            f"&secretKey={quote(self.secret_key, safe='')}"
        )


class QuorumConfig(BaseModel):
    controllers: list[ControllerAddress]
    password: str = Field(min_length=16)
    # the controller API's bearer secret (controlplane/auth.py); None: the API is open
    # (in-process test quorums only: `cluster up` always sets one)
    api_secret: str | None = Field(default=None, min_length=16)
    # a controller API on a non-loopback address without api_secret refuses to start unless set
    allow_insecure: bool = False
    # HTTPS on the controller API (both or neither); clients verify with the cluster's CA
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    settings: ControllerSettings = Field(default_factory=ControllerSettings)
    buckets: list[BucketConfig] = Field(default_factory=list)
    # the leader's self-balancer (limits and thresholds; on/off is in the metadata)
    balancer: BalancerSettings = Field(default_factory=BalancerSettings)

    def controller(self, node_id: int) -> ControllerAddress:
        for c in self.controllers:
            if c.node_id == node_id:
                return c
        raise KeyError(f"controller {node_id} is not in the quorum config")

    def api_addresses(self) -> list[str]:
        return [c.api_address for c in self.controllers]

    def api_for_raft(self, raft_address: str | None) -> str | None:
        for c in self.controllers:
            if c.raft_address == raft_address:
                return c.api_address
        return None
