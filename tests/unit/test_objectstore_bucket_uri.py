"""Bucket URI parsing, formatting and secret redaction."""

from __future__ import annotations

import pytest

from dataplane.objectstore.bucket_uri import (
    MAX_BUCKETS,
    BucketURI,
    format_bucket_uris,
    parse_bucket_uris,
)

SECRET = "s3cr3t-VALUE-never-printed"
ACCESS = "AKIDNEVERPRINTED"


def test_parses_two_buckets_with_endpoints():
    uris = parse_bucket_uris(
        "0@s3://automq-main?region=us-east-1&endpoint=http://127.0.0.1:8333,"
        " 1@s3://automq-failover?region=eu-west-1&endpoint=https://s3.example.com:9000/"
        "&pathStyle=false&authType=static"
    )
    assert [u.bucket_id for u in uris] == [0, 1]
    main, failover = uris
    assert main.bucket == "automq-main"
    assert main.region == "us-east-1"
    assert main.endpoint == "http://127.0.0.1:8333"
    assert main.path_style is True
    assert main.extra == {}
    assert failover.bucket == "automq-failover"
    assert failover.region == "eu-west-1"
    assert failover.endpoint == "https://s3.example.com:9000"  # trailing slash dropped
    assert failover.path_style is False
    assert failover.extra == {"authType": "static"}


def test_defaults_without_query():
    (uri,) = parse_bucket_uris("7@s3://bucket-a")
    assert uri == BucketURI(bucket_id=7, bucket="bucket-a")
    assert uri.region == "us-east-1" and uri.endpoint is None and uri.path_style is True


def test_parameter_names_are_case_insensitive_and_values_percent_decoded():
    (uri,) = parse_bucket_uris("3@s3://b1?REGION=ap-south-1&PathStyle=0&note=a%2Cb%26c")
    assert uri.region == "ap-south-1"
    assert uri.path_style is False
    assert uri.extra == {"note": "a,b&c"}


def test_round_trip_unredacted():
    text = (
        f"0@s3://automq-main?region=us-east-1&endpoint=http://127.0.0.1:8333"
        f"&accessKey={ACCESS}&secretKey={SECRET}&sessionToken=tok&x=y%2Cz&apiToken=abc,"
        "1@s3://automq-failover?pathStyle=false"
    )
    uris = parse_bucket_uris(text)
    again = parse_bucket_uris(format_bucket_uris(uris, redact=False))
    assert again == uris
    assert uris[0].secret_key is not None and uris[0].secret_key.get_secret_value() == SECRET
    assert uris[0].extra == {"x": "y,z"}
    assert uris[0].secret_extra["apiToken"].get_secret_value() == "abc"


def test_secrets_never_printed():
    (uri,) = parse_bucket_uris(
        f"0@s3://b1?accessKey={ACCESS}&secretKey={SECRET}&sessionToken={SECRET}x"
        f"&myPassword={SECRET}y&plain=visible"
    )
    for text in (
        uri.to_string(),
        str(uri),
        repr(uri),
        format_bucket_uris([uri]),
        repr(uri.model_dump()),
        str([uri]),
    ):
        assert SECRET not in text
        assert ACCESS not in text
    redacted = uri.to_string()
    assert "secretKey=REDACTED" in redacted and "accessKey=REDACTED" in redacted
    assert "myPassword=REDACTED" in redacted
    assert "plain=visible" in redacted
    # the redacted string still parses (it is meant for display)
    assert parse_bucket_uris(redacted)[0].bucket == "b1"


def test_credentials_from_uri_win_over_env(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ENVKEY")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "ENVSECRET")
    (with_keys,) = parse_bucket_uris(f"0@s3://b1?accessKey={ACCESS}&secretKey={SECRET}")
    assert with_keys.credentials() == {"aws_access_key_id": ACCESS, "aws_secret_access_key": SECRET}
    (without,) = parse_bucket_uris("0@s3://b1")
    assert without.credentials() == {
        "aws_access_key_id": "ENVKEY",
        "aws_secret_access_key": "ENVSECRET",
    }
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    assert without.credentials() == {}  # boto3's own chain decides


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "no bucket URIs"),
        ("   ", "no bucket URIs"),
        ("s3://bucket?region=us-east-1", "has no bucket id"),
        ("@s3://bucket", "bucket id must be an integer"),
        ("x@s3://bucket", "bucket id must be an integer"),
        ("-1@s3://bucket", "bucket id must be an integer"),
        ("40000@s3://bucket", "above 32767"),
        ("0@s3://a,0@s3://b", "duplicate bucket id 0"),
        ("0@s3://a,1@s3://b,1@s3://c", "entries 2 and 3"),
        ("0@gs://bucket", "unsupported scheme 'gs'"),
        ("0@http://bucket", "unsupported scheme"),
        ("0@bucket", "expected 's3://<bucket>'"),
        ("0@s3://", "bucket name is empty"),
        ("0@s3://?region=us-east-1", "bucket name is empty"),
        ("0@s3://a,", "entry 2 is empty"),
        ("0@s3://bad bucket", "invalid bucket name"),
        ("0@s3://b/prefix", "key prefixes"),
        ("0@s3://b?region=a&region=b", "more than once"),
        ("0@s3://b?region=", "region is empty"),
        ("0@s3://b?endpoint=ftp://host", "endpoint must look like"),
        ("0@s3://b?endpoint=notaurl", "endpoint must look like"),
        ("0@s3://b?pathStyle=perhaps", "pathStyle must be true or false"),
        ("0@s3://b?accessKey=AK", "must be given together"),
    ],
)
def test_malformed_input_gives_clear_value_error(text, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_bucket_uris(text)


def test_errors_do_not_echo_secrets():
    cases = [
        f"0@s3://b?accessKey={ACCESS}&secretKey={SECRET}&region=",
        f"0@s3://{ACCESS}:{SECRET}@bucket",
        f"s3://bucket?secretKey={SECRET}",
        f"0@s3://b?secretKey={SECRET}&pathStyle=nope",
        f"0@s3://b?secretKey={SECRET}&endpoint=ftp://x",
    ]
    for text in cases:
        with pytest.raises(ValueError) as info:
            parse_bucket_uris(text)
        assert SECRET not in str(info.value), text
        assert ACCESS not in str(info.value), text


def test_limits():
    many = ",".join(f"{i}@s3://b{i:03d}" for i in range(MAX_BUCKETS + 1))
    with pytest.raises(ValueError, match="limit"):
        parse_bucket_uris(many)
    with pytest.raises(ValueError, match="characters"):
        parse_bucket_uris("0@s3://b?x=" + "a" * 70_000)


def test_describe_names_bucket_and_endpoint():
    (uri,) = parse_bucket_uris("1@s3://automq-failover?endpoint=http://127.0.0.1:9000")
    assert uri.describe() == "bucket 1 (s3://automq-failover at http://127.0.0.1:9000)"
