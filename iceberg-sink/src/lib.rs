//! Exactly-once Iceberg sink: one atomic snapshot per checkpoint (or per K checkpoints), idempotent after any
//! crash, fenced against stale instances, for SQL (SQLite, PostgreSQL) and REST catalogs with local or S3
//! warehouses.
//!
//! # Protocol
//! | step | what happens | crash here leaves |
//! |---|---|---|
//! | `recover` | a snapshot with no files raises the subtask's owner epoch in the table; the restored checkpoint's files are committed unless the history shows it; unreferenced files of the subtask are deleted | nothing new visible; a second recovery does the same again |
//! | `begin` / `write` | Parquet (zstd) data files named `ratchet.<job>.<sink>.<subtask>.e<epoch>.c<checkpoint>-<n>.parquet`, per partition | unreferenced files: invisible, deleted at the next recovery |
//! | `pre_commit` | files closed and listed (iceberg's JSON form) in the committable | the same |
//! | record durable | the checkpoint is decided | recovery commits the files |
//! | commit | one snapshot (iceberg's `fast_append`, or Ratchet's own commit for merging and row deltas), summary `ratchet.job/sink/subtask/checkpoint/epoch`, table property `ratchet.<job>.<sink>.<subtask>` = `<epoch>:<checkpoint>` | the history shows the checkpoint: recovery skips it |
//!
//! # Why nothing lands twice or after a newer instance recovered
//! Every commit ([`TableTarget::commit_files`]) is built on metadata checked to carry this instance's epoch and
//! not to show the checkpoint yet; the catalog accepts it only if the main branch did not move since, and a
//! recovery's epoch raise ([`TableTarget::raise_epoch`]) moves it. See `docs/architecture.md` ("The Iceberg sink
//! under overlap").
//!
//! # Upserts by key (row deltas)
//! With `upsert_key`, a checkpoint's rows are applied by key: the last change of each key is written as one row,
//! and the rows it replaces are deleted, by position (`upsert_deletes = "position"`, the default: a
//! position-delete file names each replaced row's data file and position, which the subtask's key index knows,
//! `key_index.rs` / `key_scan.rs`) or by key (`"equality"`: an equality-delete file holds every upserted or
//! deleted key). Data and delete files land in one snapshot (a row delta, `row_delta.rs`, through Ratchet's own
//! catalog commit, since iceberg-rust 0.10 commits data files only). The deletes carry the snapshot's sequence
//! number, so they remove the keys' older rows and none of the snapshot's own. Position deletes are read by every
//! engine that reads format-version 2 deletes (pyiceberg and DuckDB too); equality deletes need one that applies
//! them (Spark, Trino, Flink, Iceberg's Java library; pyiceberg 0.12 refuses them, DuckDB 1.4.4 misreads them).
//! Format-version 2 tables (partitioned by any column with position deletes: a delete is filed under the replaced
//! row's partition; unpartitioned with equality deletes) and format-version 3 tables (deletion vectors in Puffin
//! files instead of position-delete files, each merged with the data file's earlier vector at the commit:
//! `deletion_vectors.rs`, `dv_commit.rs`), `commit_every = 1`; the checkpoint's rows are held in
//! memory until its pre-commit, and the key index holds every key of the table.
//!
//! # Not supported by iceberg-rust 0.10 (and not built here)
//! Position-delete and deletion-vector writers (written here: `position_deletes.rs`, `deletion_vectors.rs`),
//! overwrite and compaction of data files (compaction of append tables written here: `compaction.rs`,
//! `replace.rs`); orphan-file cleanup of other writers' files; custom commit conditions
//! (worked around by checking the load a commit is built on).
//!
//! # Memory
//! Each open data file buffers its current Parquet row group (up to 1M rows) before encoding it; a partitioned
//! table keeps one open file per partition a checkpoint touches, so memory grows with the partitions written
//! between two checkpoints. `target_file_size` bounds each file, not the buffers.
//!
//! # Small files
//! Every commit adds a snapshot, a manifest and a metadata version; `commit_every` trades visibility latency for
//! fewer of them (numbers in `docs/benchmarks.md`). `expire_snapshots = true` expires snapshots inside the sink's
//! own commits by the table's standard retention properties and deletes what they retired ([`TableTarget`]'s
//! `with_snapshot_expiry`, `retire.rs`); the sink's ledger survives expiry through its table property. Tables
//! that set `commit.manifest-merge.enabled` (every table the sink creates) have their manifests merged inside the
//! commits (`manifest_merge.rs`). `compact` rewrites the small data files of append tables inside the checkpoints'
//! own commits (`compaction.rs`, `replace.rs`; on by default for the append tables the sink created:
//! [`Compact`]); upsert tables are compacted by your usual Iceberg maintenance
//! (Spark) for now (planned).
#![deny(missing_docs)]

mod check;
mod cleanup;
mod commit;
mod committable;
mod compact_policy;
mod compaction;
mod compaction_lineage;
mod compaction_moves;
mod config;
mod deletion_vectors;
mod dv_commit;
mod equality_deletes;
mod error;
mod evolve;
mod factory;
mod guarded;
mod indexed_file;
mod key_index;
mod key_scan;
mod layout;
mod ledger;
mod live_compaction;
mod location;
mod manifest_merge;
mod metadata_swap;
mod orphan_sweep;
mod own_commit;
mod position_deletes;
mod promoted_bounds;
mod recovery;
mod replace;
mod rest_commit;
mod retire;
mod rewrite_conflicts;
mod rewritten;
mod row_delta;
mod row_lineage;
mod sink;
mod swap_outcome;
mod table_creation;
mod types;
mod unavailable;
mod upsert;
mod upsert_deletes;
mod writer;

pub use cleanup::{delete_unreferenced_files, unreferenced_files};
pub use commit::{CommitOutcome, IcebergCommitter, TableTarget};
pub use committable::{CompactedFiles, IcebergCommittable, PendingFile};
pub use compact_policy::{
    CREATED_BY_PROPERTY, Compact, CompactPolicy, DEFAULT_COMPACT_MIN_INPUT_FILES,
    DEFAULT_COMPACT_TARGET_FILE_SIZE,
};
pub use config::{
    CatalogConfig, DEFAULT_COMMIT_TIMEOUT, DEFAULT_TARGET_FILE_SIZE, IcebergSinkConfig, S3Settings,
    UpsertDeletes,
};
pub use factory::{IcebergSinkFactory, IcebergSinkSettings};
pub use layout::TableLayout;
pub use ledger::{
    CHECKPOINT_PROPERTY, EPOCH_PROPERTY, JOB_PROPERTY, SINK_PROPERTY, SUBTASK_PROPERTY, SubtaskKey,
    SubtaskState,
};
pub use manifest_merge::{
    MANIFEST_MERGE_ENABLED, MANIFEST_MIN_COUNT_TO_MERGE, MANIFEST_TARGET_SIZE_BYTES,
};
pub use orphan_sweep::{MIN_COMMIT_TIMEOUTS, sweep_orphans};
pub use retire::{DELETE_METADATA_AFTER_COMMIT, KILL_VARIABLE};
pub use sink::IcebergSink;
pub use writer::CheckpointWriter;
