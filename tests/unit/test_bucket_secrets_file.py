"""Per-bucket credentials of external buckets from a 0600 secrets file (issue #11).

`cluster up --bucket-uris ... --bucket-secrets-file F`: each bucket's keys come from F (or
the environment's AUTOMQ_S3_*_KEY_<id>); a file group or others may read is refused with a
one-line error that names no secret, and nothing is written; `cluster up --format json` and
the stored cluster.json's redacted URIs never show the keys.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli.cluster_config import ClusterError
from cli.flag_differences import flag_differences
from cli.local_cluster import LocalCluster
from dataplane.objectstore.secrets_file import BucketSecretsError, load_bucket_secrets

URIS = (
    "0@s3://main?region=us-east-1&endpoint=http://127.0.0.1:1,"
    "1@s3://failover?region=eu-west-1&endpoint=http://127.0.0.1:2"
)
SECRET_0 = "s0-" + "x" * 30
SECRET_1 = "s1-" + "y" * 30


def secrets_file(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    os.chmod(path, mode)
    return path


GOOD = (
    "# failover at another provider\n"
    "AUTOMQ_S3_ACCESS_KEY_0=AK0\n"
    f"AUTOMQ_S3_SECRET_KEY_0={SECRET_0}\n\n"
    "AUTOMQ_S3_ACCESS_KEY_1 = AK1\n"
    f"AUTOMQ_S3_SECRET_KEY_1={SECRET_1}\n"
)


def test_a_private_file_gives_each_bucket_its_keys(tmp_path):
    f = secrets_file(tmp_path / "s", GOOD)
    assert load_bucket_secrets(f) == {0: ("AK0", SECRET_0), 1: ("AK1", SECRET_1)}
    os.chmod(f, 0o400)
    assert load_bucket_secrets(f)[1] == ("AK1", SECRET_1)


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644, 0o660])
def test_a_file_others_can_read_is_refused(tmp_path, mode):
    f = secrets_file(tmp_path / "s", GOOD, mode)
    with pytest.raises(BucketSecretsError, match="readable by group or others") as err:
        load_bucket_secrets(f)
    assert "chmod 600" in str(err.value) and SECRET_0 not in str(err.value)


@pytest.mark.parametrize(
    "text, why",
    [
        (f"{SECRET_0}\n", "line 1: expected NAME=VALUE"),
        (f"AWS_SECRET_ACCESS_KEY={SECRET_0}\n", "unknown name 'AWS_SECRET_ACCESS_KEY'"),
        ("AUTOMQ_S3_ACCESS_KEY_0=AK0\n", "bucket 0 needs AUTOMQ_S3_SECRET_KEY_0"),
        ("AUTOMQ_S3_SECRET_KEY_0=\n", "AUTOMQ_S3_SECRET_KEY_0 is empty"),
        (f"AUTOMQ_S3_SECRET_KEY_0={SECRET_0}\n" * 2, "line 2: AUTOMQ_S3_SECRET_KEY_0 is given"),
    ],
)
def test_a_malformed_file_is_a_clear_error_without_the_secret(tmp_path, text, why):
    with pytest.raises(BucketSecretsError, match=why) as err:
        load_bucket_secrets(secrets_file(tmp_path / "s", text))
    assert SECRET_0 not in str(err.value)


def test_a_missing_file_or_a_directory_is_refused(tmp_path):
    with pytest.raises(BucketSecretsError, match="cannot read"):
        load_bucket_secrets(tmp_path / "absent")
    d = tmp_path / "dir"
    d.mkdir(mode=0o700)
    with pytest.raises(BucketSecretsError, match="not a regular file"):
        load_bucket_secrets(d)


def test_cluster_config_takes_the_keys_per_bucket_uri_first(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKENV")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-secret")
    only_1 = secrets_file(
        tmp_path / "s", f"AUTOMQ_S3_ACCESS_KEY_1=AK1\nAUTOMQ_S3_SECRET_KEY_1={SECRET_1}\n"
    )
    uris = URIS.replace("region=us-east-1", "region=us-east-1&accessKey=AKURI&secretKey=uri-s")
    config = LocalCluster(tmp_path / "c").create(
        1, 1, ["a"], None, uris, 6000, bucket_secrets_file=only_1
    )
    keys = {b.bucket_id: (b.access_key, b.secret_key) for b in config.buckets}
    assert keys == {0: ("AKURI", "uri-s"), 1: ("AK1", SECRET_1)}
    assert all("secretKey" not in b.uri and SECRET_1 not in b.uri for b in config.buckets)
    # the per-bucket variables in the environment come before the AWS ones
    monkeypatch.setenv("AUTOMQ_S3_ACCESS_KEY_1", "AKOWN")
    monkeypatch.setenv("AUTOMQ_S3_SECRET_KEY_1", "own-secret")
    config2 = LocalCluster(tmp_path / "c2").create(1, 1, ["a"], None, URIS, 6000)
    keys2 = {b.bucket_id: (b.access_key, b.secret_key) for b in config2.buckets}
    assert keys2 == {0: ("AKENV", "env-secret"), 1: ("AKOWN", "own-secret")}
    # a restart with the same file is no difference, with other keys it is
    assert flag_differences(config, bucket_secrets_file=only_1) == []
    other = secrets_file(
        tmp_path / "o", "AUTOMQ_S3_ACCESS_KEY_1=AK1\nAUTOMQ_S3_SECRET_KEY_1=changed\n"
    )
    [differ] = flag_differences(config, bucket_secrets_file=other)
    assert "--bucket-secrets-file" in differ and "changed" not in differ


def test_cluster_config_refuses_a_file_without_external_buckets_or_for_unknown_ones(tmp_path):
    f = secrets_file(tmp_path / "s", GOOD)
    with pytest.raises(ClusterError, match="needs --bucket-uris"):
        LocalCluster(tmp_path / "c").create(1, 1, ["a"], None, None, 6000, bucket_secrets_file=f)
    with pytest.raises(ClusterError, match=r"bucket\(s\) \[1\] that --bucket-uris"):
        LocalCluster(tmp_path / "c").create(
            1, 1, ["a"], None, URIS.split(",")[0], 6000, bucket_secrets_file=f
        )
    assert not (tmp_path / "c").exists()


def test_cluster_up_with_an_open_secrets_file_fails_in_one_line_and_writes_nothing(tmp_path):
    f = secrets_file(tmp_path / "s", GOOD, 0o644)
    d = tmp_path / "c"
    res = subprocess.run(
        [sys.executable, "-m", "cli.main", "cluster", "up", "--dir", str(d)]
        + ["--bucket-uris", URIS, "--bucket-secrets-file", str(f)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "300"},
    )
    assert res.returncode == 1, res.stdout + res.stderr
    [line] = res.stderr.strip().splitlines()
    assert "readable by group or others (mode 0644)" in line
    assert SECRET_0 not in res.stderr + res.stdout
    assert not (d / "cluster.json").exists()


def test_failover_detect_s_sets_the_controller_setting_and_is_validated(tmp_path):
    config = LocalCluster(tmp_path / "c").create(
        1, 1, ["a"], None, None, 6000, failover_detect_s=1.5
    )
    assert config.settings.bucket_failover_detect_ms == 1500
    assert flag_differences(config, failover_detect_s=1.5) == []
    assert flag_differences(config, failover_detect_s=10) == [
        "--failover-detect-s 10 (the cluster has 1.5)"
    ]
    res = subprocess.run(
        [sys.executable, "-m", "cli.main", "cluster", "up", "--dir", str(tmp_path / "d")]
        + ["--failover-detect-s", "0.1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode != 0 and "--failover-detect-s" in res.stderr
    assert not (tmp_path / "d").exists()


def test_the_compaction_job_gets_each_buckets_own_keys(tmp_path, monkeypatch):
    from cli.compaction_jobs import job_config, job_env
    from dataplane.objectstore import BucketURI

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name, raising=False)
    config = LocalCluster(tmp_path / "c").create(
        1, 1, ["a"], None, URIS, 6000, bucket_secrets_file=secrets_file(tmp_path / "s", GOOD)
    )
    env = job_env(config)
    assert SECRET_1 not in json.dumps(job_config(config, "local[2]"))  # no key in job.json
    monkeypatch.setattr(os, "environ", env)  # what the job process sees
    for bucket_id, uri in job_config(config, "local[2]")["buckets"].items():
        keys = BucketURI.parse(uri).credentials()
        assert (keys["aws_access_key_id"], keys["aws_secret_access_key"]) == (
            {0: ("AK0", SECRET_0), 1: ("AK1", SECRET_1)}[bucket_id]
        )
