"""Reading checkpoints from S3 (moto's server on 127.0.0.1) gives the same figures as local disk."""

from __future__ import annotations

import json

import boto3

from catalog import ALL_FIXTURES


def upload(endpoint: str, bucket: str, fixture, scheme: str = "s3") -> str:
    client = boto3.client("s3", endpoint_url=endpoint)
    client.create_bucket(Bucket=bucket)
    job_dir = fixture.checkpoint.parent
    for path in job_dir.rglob("*"):
        if path.is_file():
            client.upload_file(str(path), bucket, f"{fixture.name}/{path.relative_to(job_dir.parent)}")
    return f"{scheme}://{bucket}/{fixture.name}/{job_dir.name}/{fixture.checkpoint.name}"


def test_inspect_from_s3_equals_local(ckpt, s3_endpoint):
    for index, fixture in enumerate(ALL_FIXTURES):
        uri = upload(s3_endpoint, f"inspect-{index}", fixture, scheme="s3a" if index % 2 else "s3")
        code, remote, err = ckpt("inspect", "--json", uri)
        assert code == 0, err
        code, local, err = ckpt("inspect", "--json", str(fixture.checkpoint))
        # the same files, named by where they are
        local = local.replace(str(fixture.directory), f"s3://inspect-{index}/{fixture.name}")
        assert json.loads(remote) == json.loads(local)


def test_missing_s3_checkpoint_is_a_clean_error(ckpt, s3_endpoint):
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket="empty")
    code, out, err = ckpt("inspect", "s3://empty/nothing/chk-1")
    assert code == 2 and out == ""
    assert err.startswith("ckpt: error: s3://empty/nothing/chk-1 is not a checkpoint") and len(err.splitlines()) == 1
