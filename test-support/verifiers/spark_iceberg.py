"""Apache Spark with Iceberg's Spark runtime over a table Ratchet writes: the engine most users read and maintain
Iceberg tables with, run here as an independent reader and as a foreign maintainer (not Ratchet code).

    spark_iceberg.py read     <catalog.db> <warehouse> <namespace.table> <id column>
    spark_iceberg.py maintain <catalog.db> <warehouse> <namespace.table> <stop file> <orphan cut-off seconds>
    spark_iceberg.py scan     <catalog.db> <warehouse> <namespace.table>
    spark_iceberg.py rewrite  <catalog.db> <warehouse> <namespace.table>

The catalog is the SQLite database the sink commits to, opened with Iceberg's JdbcCatalog (catalog name
`ratchet`, as the tests name it); the warehouse is a local directory. Run inside serve.py (as the tests run `read`, `lineage`, `rewrite`, `delete`, `upgrade` and
`delete_files`) the Spark session outlives the run: one JVM per interpreter, not one per read.

`read` prints {"column_names": [...], "rows": [[...], ...]} (sorted by the id column), read merge-on-read: every
position, equality and deletion-vector delete applied by Spark's own scan.

`scan` (a benchmark's reader-side cost) times a full scan of the table (Spark's `noop` sink: every row read and
merged, nothing collected; the faster of two after a warm-up count), counts its live data and delete files, then
compacts it the way an operator would (rewrite_data_files of every file with deletes applied, then
rewrite_position_delete_files, which drops the deletes left dangling) and measures again; prints
{"before": {...}, "compaction_seconds": s, "after": {...}}.

`rewrite` runs one rewrite_data_files of every data file (a foreign compaction) and prints
{"rewritten_data_files": n}.

`maintain` runs Spark's maintenance procedures in a loop while the sink writes, until the stop file exists (after
each round it writes what it did so far to `progress` beside the stop file):
rewrite_data_files (every file, delete files applied: `rewrite-all`), rewrite_manifests, expire_snapshots (keeping
the last 2) and Spark's orphan-file removal (the DeleteOrphanFiles action behind remove_orphan_files) with the
cut-off. Each procedure's commit can lose a race with the sink's
commits; Iceberg then refuses it (a validation or commit-state error) and the loop counts it as a conflict and goes
on: losing is the foreign side's correct outcome. Any other error fails the script. Prints per procedure how many
runs committed and how many lost, and how many data files the rewrites replaced.

The jars (iceberg-spark-runtime-4.1_2.13, sqlite-jdbc) come from RATCHET_SPARK_JARS (scripts/services.sh copies
them, pinned in test-support/verifiers/spark/pom.xml); pyspark is pinned in scripts/services/requirements.txt.
"""

import glob
import json
import os
import sys
import time

CATALOG = "ratchet"
# What a procedure meets when it loses a race with the sink, by procedure: a commit whose base moved (retried, then
# given up); Iceberg's validation on that retry (a rewrite of data files the sink deleted from since it started,
# a rewrite of manifests the sink's own merging replaced meanwhile); and for every procedure a file of a snapshot
# the sink's own expiry deleted after the procedure loaded the table (the procedure fails before it changes
# anything). Anything else fails the script.
MOVED = ("CommitFailedException", "SQLITE_BUSY", "ValidationException")
EXPIRED = ("NotFoundException",)
LOST_RACE = {
    "rewrite_data_files": MOVED + EXPIRED + ("Cannot commit rewrite",),
    "rewrite_manifests": MOVED + EXPIRED,
    "expire_snapshots": MOVED + EXPIRED,
    "remove_orphan_files": EXPIRED,
}


def session():
    """The Spark session. Inside serve.py (the tests' long-lived verifier interpreters, which set
    `sys._ratchet_serve`) one session is kept per interpreter (`sys._ratchet_spark`), so a test binary starts Spark's
    JVM (about 15 s here) once per concurrent caller instead of at every read; otherwise a fresh one, which the
    command stops (`finish`)."""
    from pyspark.sql import SparkSession

    kept = getattr(sys, "_ratchet_spark", None)
    if kept is not None:
        return kept
    jars = sorted(glob.glob(os.path.join(os.environ["RATCHET_SPARK_JARS"], "*.jar")))
    if not jars:
        sys.exit(f"no jars in {os.environ['RATCHET_SPARK_JARS']}: run scripts/services.sh up")
    spark = (
        SparkSession.builder.master("local[1]")
        .appName("ratchet-spark-iceberg")
        .config("spark.jars", ",".join(jars))
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.extensions", "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions")
        .getOrCreate()
    )
    if getattr(sys, "_ratchet_serve", False):
        spark.sparkContext.setLogLevel("ERROR")
        sys._ratchet_spark = spark
    return spark


def opened(db: str, warehouse: str, table: str):
    """A session with the catalog `ratchet` (Iceberg's JdbcCatalog: the name is also the `catalog_name` its rows
    carry, so it cannot change) over the SQLite database `db` and `warehouse`, and `table`'s name in it. Inside
    serve.py it is a new session (`newSession`: its own SQL settings and catalogs, the kept JVM and SparkContext)
    per run, since one session caches a catalog per name; the catalog's table cache is off as well."""
    spark = session()
    if getattr(sys, "_ratchet_spark", None) is spark:
        spark = spark.newSession()
    prefix = f"spark.sql.catalog.{CATALOG}"
    for key, value in (
        ("", "org.apache.iceberg.spark.SparkCatalog"),
        (".type", "jdbc"),
        (".uri", f"jdbc:sqlite:{db}"),
        (".warehouse", warehouse),
        # The sink's SQL catalog has no view support column: the catalog schema Iceberg calls V0.
        (".jdbc.schema-version", "V0"),
        (".cache-enabled", "false"),
    ):
        spark.conf.set(prefix + key, value)
    return spark, f"{CATALOG}.{table}"


def finish(spark) -> None:
    """Stops Spark after a one-shot run; a kept session (serve.py) stays for the next run."""
    if getattr(sys, "_ratchet_spark", None) is None:
        spark.stop()


def read(db: str, warehouse: str, table: str, id_column: str) -> None:
    spark, name = opened(db, warehouse, table)
    frame = spark.table(name).orderBy(id_column)
    rows = [[value for value in row] for row in frame.collect()]
    json.dump({"column_names": frame.columns, "rows": rows}, sys.stdout, default=str)
    finish(spark)


def lineage(db: str, warehouse: str, table: str) -> None:
    """Row lineage of a format-version 3 table: per snapshot and now, each row's id, _row_id and
    _last_updated_sequence_number; and how many manifests the current snapshot names."""
    spark, name = opened(db, warehouse, table)

    def rows(version: str) -> list:
        frame = spark.sql(f"SELECT id, _row_id, _last_updated_sequence_number FROM {name}{version} ORDER BY id")
        return [[row["id"], row["_row_id"], row["_last_updated_sequence_number"]] for row in frame.collect()]

    snapshots = [row["snapshot_id"] for row in spark.sql(f"SELECT snapshot_id FROM {name}.snapshots").collect()]
    json.dump({
        "snapshots": {str(s): rows(f" VERSION AS OF {s}") for s in snapshots},
        "current": rows(""),
        "manifests": spark.sql(f"SELECT count(*) AS n FROM {name}.manifests").collect()[0]["n"],
    }, sys.stdout)
    finish(spark)


def scan(db: str, warehouse: str, table: str) -> None:
    spark, name = opened(db, warehouse, table)

    def measured() -> dict:
        files = {row["content"]: row["n"] for row in
                 spark.sql(f"SELECT content, count(*) AS n FROM {name}.files GROUP BY content").collect()}
        rows = spark.table(name).count()
        seconds = []
        for _ in range(2):
            started = time.perf_counter()
            spark.table(name).write.format("noop").mode("overwrite").save()
            seconds.append(time.perf_counter() - started)
        return {"rows": rows, "data_files": files.get(0, 0), "position_delete_files": files.get(1, 0),
                "equality_delete_files": files.get(2, 0), "scan_seconds": min(seconds)}

    before = measured()
    started = time.perf_counter()
    spark.sql(f"CALL {CATALOG}.system.rewrite_data_files(table => '{name}', options => map('rewrite-all', 'true'))")
    spark.sql(f"CALL {CATALOG}.system.rewrite_position_delete_files(table => '{name}', "
              "options => map('rewrite-all', 'true'))")
    compaction = time.perf_counter() - started
    json.dump({"before": before, "compaction_seconds": compaction, "after": measured()}, sys.stdout)
    finish(spark)


def rewrite(db: str, warehouse: str, table: str) -> None:
    """One rewrite_data_files of every data file (a foreign compaction), committed; prints how many it rewrote."""
    spark, name = opened(db, warehouse, table)
    result = spark.sql(
        f"CALL {CATALOG}.system.rewrite_data_files(table => '{name}', "
        "options => map('rewrite-all', 'true', 'min-input-files', '1'))"
    ).collect()
    json.dump({"rewritten_data_files": result[0]["rewritten_data_files_count"]}, sys.stdout)
    finish(spark)


def delete(db: str, warehouse: str, table: str, where: str) -> None:
    """A `DELETE FROM <table> WHERE <where>` (another writer: on a merge-on-read format-version 3 table Spark writes
    a deletion vector); prints the delete files live after it."""
    spark, name = opened(db, warehouse, table)
    spark.sql(f"DELETE FROM {name} WHERE {where}")
    json.dump({"delete_files": live_delete_files(spark, name)}, sys.stdout)
    finish(spark)


def upgrade(db: str, warehouse: str, table: str, version: str) -> None:
    """Upgrades the table to Iceberg format version `version` (`ALTER TABLE .. SET TBLPROPERTIES`)."""
    spark, name = opened(db, warehouse, table)
    spark.sql(f"ALTER TABLE {name} SET TBLPROPERTIES ('format-version' = '{version}')")
    json.dump({"delete_files": live_delete_files(spark, name)}, sys.stdout)
    finish(spark)


def delete_files(db: str, warehouse: str, table: str) -> None:
    """The delete files of the current snapshot, as Spark's `delete_files` metadata table lists them."""
    spark, name = opened(db, warehouse, table)
    json.dump({"delete_files": live_delete_files(spark, name)}, sys.stdout)
    finish(spark)


def live_delete_files(spark, name: str) -> list:
    rows = spark.sql(f"SELECT content, file_path, file_format, referenced_data_file, record_count, content_offset "
                     f"FROM {name}.delete_files").collect()
    return [row.asDict() for row in rows]


def lost_race(procedure: str, error: Exception) -> bool:
    text = str(error)
    return any(marker in text for marker in LOST_RACE[procedure])


def remove_orphan_files(spark, table: str, cutoff_s: float) -> int:
    """Spark's DeleteOrphanFiles action (what the remove_orphan_files procedure runs; the procedure refuses a
    cut-off under 24 hours and says to use the action for a shorter one): deletes the table's files no snapshot
    references that are older than `cutoff_s`; returns how many."""
    jvm = spark._jvm
    loaded = jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(spark._jsparkSession, table)
    older_than = int((time.time() - cutoff_s) * 1000)
    action = jvm.org.apache.iceberg.spark.actions.SparkActions.get(spark._jsparkSession).deleteOrphanFiles(loaded)
    result = action.olderThan(older_than).execute()
    removed, locations = 0, result.orphanFileLocations().iterator()
    while locations.hasNext():
        locations.next()
        removed += 1
    return removed


def maintain(db: str, warehouse: str, table: str, stop_file: str, orphan_cutoff_s: str) -> None:
    spark, name = opened(db, warehouse, table)
    done = {p: {"committed": 0, "lost": 0} for p in
            ("rewrite_data_files", "rewrite_manifests", "expire_snapshots", "remove_orphan_files")}
    rewritten = 0
    orphans = 0
    progress = os.path.join(os.path.dirname(stop_file), "progress")

    def report() -> dict:
        summary = {"procedures": done, "rewritten_data_files": rewritten, "orphans_removed": orphans}
        with open(progress + ".tmp", "w") as f:
            json.dump(summary, f)
        os.replace(progress + ".tmp", progress)
        return summary

    # Counted and reported after each procedure, not each round: a test that holds a pre-committed checkpoint
    # until a rewrite lands must know when an orphan removal has just finished (its files must never meet one
    # before they are referenced).
    def attempt(procedure: str, run):
        nonlocal rewritten, orphans
        try:
            result = run()
        except Exception as e:  # noqa: BLE001 - a lost race is counted, anything else re-raised
            if not lost_race(procedure, e):
                raise
            done[procedure]["lost"] += 1
            report()
            return
        if procedure == "rewrite_data_files" and result[0]["rewritten_data_files_count"] == 0:
            # Every group lost (partial progress reports them as failed instead of raising).
            done[procedure]["lost"] += 1
        else:
            done[procedure]["committed"] += 1
        if procedure == "rewrite_data_files":
            rewritten += result[0]["rewritten_data_files_count"]
        if procedure == "remove_orphan_files":
            orphans += result
        report()

    def call(procedure: str, sql: str):
        attempt(procedure, lambda: spark.sql(sql).collect())

    while not os.path.exists(stop_file):
        call(
            "rewrite_data_files",
            f"CALL {CATALOG}.system.rewrite_data_files(table => '{name}', "
            # Small groups committed one by one: a group holding a file the sink deleted from since the rewrite
            # began loses (Iceberg's validation), the others land.
            "options => map('rewrite-all', 'true', 'min-input-files', '1', 'max-file-group-size-bytes', '20000', "
            "'partial-progress.enabled', 'true', 'partial-progress.max-commits', '20'))",
        )
        call("rewrite_manifests", f"CALL {CATALOG}.system.rewrite_manifests(table => '{name}')")
        call(
            "expire_snapshots",
            f"CALL {CATALOG}.system.expire_snapshots(table => '{name}', "
            f"older_than => TIMESTAMP '{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(time.time() + 1))}', "
            "retain_last => 2)",
        )
        attempt("remove_orphan_files", lambda: remove_orphan_files(spark, name, float(orphan_cutoff_s)))
    json.dump(report(), sys.stdout)
    finish(spark)


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    os.environ.setdefault("TZ", "UTC")
    {"read": read, "lineage": lineage, "maintain": maintain, "scan": scan, "rewrite": rewrite, "delete": delete,
     "delete_files": delete_files, "upgrade": upgrade}[command](*args)
