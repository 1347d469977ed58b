"""Independent verifier: the values of one column in every visible data file of a local directory or an S3
prefix, and whatever the sink left behind that should not be there, as JSON.

usage: visible_ids.py local DIR COLUMN
       visible_ids.py s3 BUCKET PREFIX COLUMN     (endpoint and keys from RATCHET_S3_* variables)

Visible = not under a path component starting with "." or "_" (what Hive, Spark and Trino read). Files are read
with pyarrow by extension (.parquet, .jsonl, .csv). Prints {"ids": [...one per row...], "files": [...],
"strays": [...]}: strays are in-progress/pending/spill files (local), or open multipart uploads and staged
objects (S3) of Ratchet under the directory or prefix.
"""

import io
import json
import os
import sys
from pathlib import Path

import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq


def read_table(name: str, data: bytes):
    if name.endswith(".parquet"):
        return pq.read_table(io.BytesIO(data))
    if name.endswith(".jsonl"):
        return pajson.read_json(io.BytesIO(data))
    if name.endswith(".csv"):
        return pacsv.read_csv(io.BytesIO(data))
    return None


def visible(parts) -> bool:
    return not any(p.startswith(".") or p.startswith("_") for p in parts)


def local(directory: str, column: str) -> dict:
    root = Path(directory)
    ids, files, strays = [], [], []
    if root.exists():
        for path in sorted(root.rglob("*")):
            if not path.is_file():
                continue
            rel = path.relative_to(root).parts
            if visible(rel):
                table = read_table(path.name, path.read_bytes())
                if table is not None:
                    files.append("/".join(rel))
                    ids.extend(table.column(column).to_pylist())
            elif path.name.endswith((".inprogress", ".pending")) or path.name.startswith(".ratchet-spill-"):
                strays.append("/".join(rel))
    return {"ids": ids, "files": files, "strays": strays}


def s3(bucket: str, prefix: str, column: str) -> dict:
    import boto3
    from botocore.config import Config

    client = boto3.client(
        "s3",
        endpoint_url=os.environ["RATCHET_S3_ENDPOINT"],
        region_name=os.environ["RATCHET_S3_REGION"],
        aws_access_key_id=os.environ["RATCHET_S3_ACCESS_KEY"],
        aws_secret_access_key=os.environ["RATCHET_S3_SECRET_KEY"],
        config=Config(s3={"addressing_style": "path"}),
    )
    scope = prefix.strip("/") + "/" if prefix.strip("/") else ""
    ids, files, strays = [], [], []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=scope):
        for obj in page.get("Contents", []):
            key = obj["Key"]
            rel = key[len(scope):].split("/")
            if visible(rel):
                data = client.get_object(Bucket=bucket, Key=key)["Body"].read()
                table = read_table(rel[-1], data)
                if table is not None:
                    files.append("/".join(rel))
                    ids.extend(table.column(column).to_pylist())
            elif rel[0] == "_ratchet-staging":
                strays.append("staged " + "/".join(rel))
    uploads = client.list_multipart_uploads(Bucket=bucket, Prefix=scope).get("Uploads", [])
    strays.extend("multipart " + u["Key"] for u in uploads)
    return {"ids": ids, "files": files, "strays": strays}


if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) == 3 and args[0] == "local":
        out = local(args[1], args[2])
    elif len(args) == 4 and args[0] == "s3":
        out = s3(args[1], args[2], args[3])
    else:
        raise SystemExit(__doc__)
    json.dump(out, sys.stdout)
    # pyarrow's thread pools can abort the interpreter at shutdown ("terminate called without an active
    # exception", about 1 run in 40 here); the result is complete and flushed, so leave without that teardown.
    sys.stdout.flush()
    os._exit(0)
