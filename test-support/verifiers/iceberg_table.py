"""Independent verifier: what pyiceberg and DuckDB see in an Iceberg table of a SQL catalog, as JSON.

usage: iceberg_table.py CATALOG_NAME CATALOG_URI WAREHOUSE TABLE ID_COLUMN [--columns]

CATALOG_URI is a SQLAlchemy URI (sqlite:////abs/path.db or postgresql+psycopg://...) of a SQL catalog, or the
http:// URI of a REST catalog (SeaweedFS's: OAuth2 client credential RATCHET_S3_ACCESS_KEY:RATCHET_S3_SECRET_KEY).
An s3:// warehouse is read with RATCHET_S3_ENDPOINT / _REGION / _ACCESS_KEY / _SECRET_KEY from the environment. Prints
{"exists": bool, "ids": [sorted ID_COLUMN values per pyiceberg], "duckdb_ids": [the same per DuckDB's
iceberg_scan of the current metadata file], "snapshots": [{"snapshot_id", "parent_id", "summary"}...],
"properties": {...}, "unreferenced": [Ratchet's data files (named ratchet.*) under the table's data/ directory
that no manifest of any retained snapshot lists, locations compared with repeated '/' collapsed]} with snapshots
oldest first. Both readers see only what the current metadata references. With --columns it also prints
"columns": {column: [ID_COLUMN values of the rows where it is not null, sorted]} for every column of the current
schema, as pyiceberg reads them (a data file written before a column was added reads as null there). With --rows
it also prints "rows": every row as a list of its values in the schema's column order, and "column_names". With
--metadata-files it also prints "unreferenced_manifest_lists" (manifest lists under metadata/ no retained snapshot
names), "unreferenced_manifests" (the other .avro files under metadata/, manifests, that no retained snapshot's list
names), "current_manifests" (how many manifests the current snapshot's list names), "snapshot_rows" ([{"snapshot_id",
"rows": rows pyiceberg reads at that snapshot, "total_records": its summary's total-records}] for every retained
snapshot), "inconsistent_entries" (data files whose live entries disagree across the retained snapshots' manifests
on the snapshot that added them, their data or their file sequence number: a manifest rewrite must keep all three)
and "metadata_json_files" (how many metadata JSON files metadata/ holds).
"""

import json
import os
import sys

from pyiceberg.exceptions import NoSuchTableError


def s3_props() -> dict:
    endpoint = os.environ.get("RATCHET_S3_ENDPOINT")
    if not endpoint:
        return {}
    return {
        "s3.endpoint": endpoint,
        "s3.region": os.environ.get("RATCHET_S3_REGION", "us-east-1"),
        "s3.access-key-id": os.environ["RATCHET_S3_ACCESS_KEY"],
        "s3.secret-access-key": os.environ["RATCHET_S3_SECRET_KEY"],
        "s3.force-virtual-addressing": "false",
    }


def duckdb_ids(metadata_location: str, id_column: str) -> list:
    import duckdb

    con = duckdb.connect()
    ext_dir = os.path.join(os.path.dirname(duckdb.__file__), "..", "duckdb_ext", "extensions")
    con.execute("SET autoinstall_known_extensions=false")
    con.execute(f"SET extension_directory='{os.path.abspath(ext_dir)}'")
    con.execute("LOAD iceberg")
    if metadata_location.startswith("s3://"):
        con.execute("LOAD httpfs")
        endpoint = os.environ["RATCHET_S3_ENDPOINT"].split("://", 1)[1]
        con.execute(
            "CREATE SECRET (TYPE S3, KEY_ID ?, SECRET ?, REGION ?, ENDPOINT ?, URL_STYLE 'path', USE_SSL false)",
            [
                os.environ["RATCHET_S3_ACCESS_KEY"],
                os.environ["RATCHET_S3_SECRET_KEY"],
                os.environ.get("RATCHET_S3_REGION", "us-east-1"),
                endpoint,
            ],
        )
    path = metadata_location.removeprefix("file://")
    rows = con.execute(f'SELECT "{id_column}" FROM iceberg_scan(?)', [path]).fetchall()
    return sorted(r[0] for r in rows)


def canonical(location: str) -> str:
    """One spelling of a location: every run of '/' after the scheme collapsed (a manifest may say wh//ns/t where
    storage lists wh/ns/t, both one file)."""
    scheme, sep, rest = location.partition("://")
    if not sep:
        scheme, rest = "", location
    while "//" in rest:
        rest = rest.replace("//", "/")
    return f"{scheme}{sep}{rest}"


def files_on_storage(location: str, directory: str, name_prefix: str) -> list:
    """Every file whose name starts with name_prefix under <location>/<directory>/, as a full location."""
    root_location = location.rstrip("/") + f"/{directory}/"
    if root_location.startswith("s3://"):
        import boto3

        bucket, prefix = root_location[len("s3://"):].split("/", 1)
        s3 = boto3.client(
            "s3",
            endpoint_url=os.environ["RATCHET_S3_ENDPOINT"],
            region_name=os.environ.get("RATCHET_S3_REGION", "us-east-1"),
            aws_access_key_id=os.environ["RATCHET_S3_ACCESS_KEY"],
            aws_secret_access_key=os.environ["RATCHET_S3_SECRET_KEY"],
        )
        keys = []
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            keys += [o["Key"] for o in page.get("Contents", [])]
        return [canonical(f"s3://{bucket}/{k}") for k in keys if k.rsplit("/", 1)[-1].startswith(name_prefix)]
    root = root_location.removeprefix("file://")
    found = []
    for walked, _, names in os.walk(root):
        found += [canonical("file://" + os.path.join(walked, n)) for n in names if n.startswith(name_prefix)]
    return found


def data_files_on_storage(location: str) -> list:
    """Every file named ratchet.* under <location>/data/, as a full location."""
    return files_on_storage(location, "data", "ratchet.")


def metadata_files(table, id_column: str) -> dict:
    """What lies in the table's metadata/ directory: the manifest lists (snap-*) and manifests no retained snapshot
    names, how many metadata JSON files there are; and every retained snapshot read back."""
    location = table.metadata.location
    io = table.io
    everything = files_on_storage(location, "metadata", "")
    lists = {f for f in everything if f.rsplit("/", 1)[-1].startswith("snap-")}
    manifests = {f for f in everything if f.endswith(".avro")} - lists
    named = {canonical(s.manifest_list) for s in table.metadata.snapshots}
    named_manifests = {canonical(m.manifest_path) for s in table.metadata.snapshots for m in s.manifests(io)}
    jsons = [f for f in everything if f.endswith(".metadata.json")]
    current = table.metadata.current_snapshot()
    snapshot_rows = [
        {
            "snapshot_id": s.snapshot_id,
            "rows": table.scan(snapshot_id=s.snapshot_id, selected_fields=(id_column,)).to_arrow().num_rows,
            "total_records": int(s.summary.additional_properties.get("total-records", -1)) if s.summary else -1,
        }
        for s in table.metadata.snapshots
    ]
    seen_entries: dict = {}
    inconsistent = set()
    for s in table.metadata.snapshots:
        for manifest in s.manifests(io):
            for entry in manifest.fetch_manifest_entry(io, discard_deleted=True):
                path = canonical(entry.data_file.file_path)
                identity = (entry.snapshot_id, entry.sequence_number, entry.file_sequence_number)
                if seen_entries.setdefault(path, identity) != identity:
                    inconsistent.add(path)
    return {
        "inconsistent_entries": sorted(inconsistent),
        "unreferenced_manifest_lists": sorted(lists - named),
        "unreferenced_manifests": sorted(manifests - named_manifests),
        "current_manifests": len(current.manifests(io)) if current else 0,
        "snapshot_rows": snapshot_rows,
        "metadata_json_files": len(jsons),
    }


def referenced_files(table) -> set:
    io = table.io
    paths = set()
    for snapshot in table.metadata.snapshots:
        for manifest in snapshot.manifests(io):
            for entry in manifest.fetch_manifest_entry(io, discard_deleted=False):
                paths.add(canonical(entry.data_file.file_path))
    return paths


def main(name: str, uri: str, warehouse: str, table_name: str, id_column: str, *flags: str) -> None:
    # Imported lazily: each catalog module costs about half a second, and tests run this script often.
    if uri.startswith("http"):
        from pyiceberg.catalog.rest import RestCatalog

        credential = f'{os.environ["RATCHET_S3_ACCESS_KEY"]}:{os.environ["RATCHET_S3_SECRET_KEY"]}'
        catalog = RestCatalog(name, uri=uri, warehouse=warehouse, credential=credential, **s3_props())
    else:
        from pyiceberg.catalog.sql import SqlCatalog

        catalog = SqlCatalog(name, uri=uri, warehouse=warehouse, **s3_props())
    try:
        table = catalog.load_table(table_name)
    except NoSuchTableError:
        json.dump(
            {"exists": False, "ids": [], "duckdb_ids": [], "snapshots": [], "properties": {}, "unreferenced": []},
            sys.stdout,
        )
        return
    data = table.scan(selected_fields=(id_column,)).to_arrow()
    snapshots = [
        {
            "snapshot_id": s.snapshot_id,
            "parent_id": s.parent_snapshot_id,
            "summary": dict(s.summary.additional_properties) if s.summary else {},
        }
        for s in sorted(table.metadata.snapshots, key=lambda s: s.sequence_number or 0)
    ]
    out = {
        "exists": True,
        "ids": sorted(data.column(id_column).to_pylist()),
        "duckdb_ids": duckdb_ids(table.metadata_location, id_column) if table.metadata.current_snapshot_id else [],
        "snapshots": snapshots,
        "properties": dict(table.metadata.properties),
        "unreferenced": sorted(set(data_files_on_storage(table.metadata.location)) - referenced_files(table)),
    }
    if "--columns" in flags:
        rows = table.scan().to_arrow()
        ids = rows.column(id_column).to_pylist()
        out["columns"] = {
            column: sorted(i for i, v in zip(ids, rows.column(column).to_pylist()) if v is not None)
            for column in rows.column_names
        }
    if "--metadata-files" in flags:
        out.update(metadata_files(table, id_column))
    if "--rows" in flags:
        rows = table.scan().to_arrow()
        out["column_names"] = rows.column_names
        out["rows"] = [list(r.values()) for r in rows.to_pylist()]
    json.dump(out, sys.stdout, default=str)


if __name__ == "__main__":
    if len(sys.argv) < 6:
        raise SystemExit(__doc__)
    main(*sys.argv[1:])
    # pyarrow's thread pools can abort the interpreter at shutdown ("terminate called without an active
    # exception", about 1 run in 40 here); the result is complete and flushed, so leave without that teardown.
    sys.stdout.flush()
    os._exit(0)
