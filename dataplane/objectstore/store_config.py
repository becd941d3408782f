"""`ObjectStorageConfig`: the tunables of `ObjectStorage` (timeouts, retries, pool and
pending-request bounds, range merging, bandwidth limits, object and batch sizes), each
bounded."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["S3_MAX_DELETE_BATCH", "ObjectStorageConfig"]

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
S3_MAX_DELETE_BATCH = 1000  # S3's limit for one DeleteObjects request


class ObjectStorageConfig(BaseModel):
    """Tunables of ObjectStorage, every one bounded."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    connect_timeout_ms: int = Field(
        3_000, ge=1, le=600_000, description="TCP connect timeout of one request"
    )
    read_timeout_ms: int = Field(
        30_000, ge=1, le=600_000, description="socket read timeout of one request"
    )
    check_timeout_ms: int = Field(
        2_000, ge=1, le=60_000, description="timeout of check_reachable (startup checks)"
    )
    max_attempts: int = Field(
        4, ge=1, le=20, description="attempts of a request (timeouts, 5xx, throttling)"
    )
    backoff_base_ms: int = Field(50, ge=0, le=60_000, description="first retry backoff")
    backoff_max_ms: int = Field(
        2_000, ge=0, le=600_000, description="longest retry backoff (>= backoff_base_ms)"
    )
    max_concurrency: int = Field(16, ge=1, le=512, description="threads of the async pool")
    extra_sync_connections: int = Field(
        8, ge=0, le=512, description="pool headroom for sync callers"
    )
    max_pending_requests: int = Field(
        4_096, ge=1, le=1_000_000, description="async requests queued at most; more fail at once"
    )
    merge_window_ms: float = Field(
        5.0,
        ge=0,
        le=1_000,
        description="range reads arriving this close together may share one GET; 0 disables "
        "merging",
    )
    merge_gap_bytes: int = Field(
        512 * KiB, ge=0, le=256 * MiB, description="largest gap between merged ranges"
    )
    merge_max_bytes: int = Field(4 * MiB, ge=0, le=256 * MiB, description="largest merged GET")
    merge_max_open_batches: int = Field(
        4_096, ge=1, le=1_000_000, description="merge batches waiting at once"
    )
    read_bandwidth_bytes_per_s: int = Field(0, ge=0, description="read limit; 0 = unlimited")
    write_bandwidth_bytes_per_s: int = Field(0, ge=0, description="write limit; 0 = unlimited")
    throttle_timeout_ms: int = Field(
        60_000,
        ge=1,
        le=3_600_000,
        description="longest a request waits for bandwidth before it fails",
    )
    max_object_bytes: int = Field(
        1 * GiB,
        ge=1,
        le=5 * GiB,
        description="largest object put or read whole (S3 allows 5 GiB in one PUT)",
    )
    delete_batch_keys: int = Field(
        S3_MAX_DELETE_BATCH,
        ge=1,
        le=S3_MAX_DELETE_BATCH,
        description="keys per DeleteObjects request",
    )
    sign_payloads: bool = Field(
        False,
        description="SHA-256 sign PUT payloads (SigV4 always signs the headers; False sends "
        "UNSIGNED-PAYLOAD: ~0.1 s of CPU less per 60 MB object, standard over TLS, and "
        "objects carry CRC32C checksums every read verifies)",
    )

    lean_range_gets: bool = Field(
        True,
        description="catch-up reads' ranged GETs without botocore where the bucket allows it "
        "(a plain http endpoint, static credentials): ~1/3 of the CPU per GET; false sends "
        "them through botocore like every other request",
    )
    lean_puts: bool = Field(
        True,
        description="PUTs without botocore where the bucket allows it (a plain http "
        "endpoint, static credentials) and payloads go unsigned: ~0.4x the CPU per GB "
        "uploaded; false sends them through botocore",
    )

    @model_validator(mode="after")
    def _check(self) -> ObjectStorageConfig:
        if self.backoff_max_ms < self.backoff_base_ms:
            raise ValueError("backoff_max_ms must be >= backoff_base_ms")
        return self
