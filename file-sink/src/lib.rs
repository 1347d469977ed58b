//! Exactly-once file sink: files on local disk or S3, staged per checkpoint and made visible only at commit.
//!
//! [`FileSink`] writes Arrow batches as Parquet (zstd by default), JSON lines or CSV ([`FormatConfig`]), into
//! Hive-style partition directories from record fields and event or processing time ([`PartitionConfig`]),
//! rolling files by size and record count and always at a checkpoint ([`RollingPolicy`]), to a local directory or
//! an S3 bucket ([`StorageConfig`]).
//!
//! # Guarantee
//! Exactly once (or, through [`connector_api::GuaranteedSink`], at least once / at most once): every record
//! written between two checkpoints lands in exactly one visible file once that checkpoint's record is durable.
//! Readers that skip hidden (`.`-prefixed) files and `_`-prefixed directories never see partial or aborted output.
//!
//! # Mechanism
//! | step | local filesystem | S3 |
//! |---|---|---|
//! | `write` | rows go to `.<name>.inprogress` (hidden) | rows go to a local spill file; each full part (≥ 5 MiB) is uploaded into a multipart upload |
//! | `pre_commit` | the file is closed, fsynced, renamed to `.<name>.pending`, directory fsynced | the last part is uploaded (key, upload id and part ETags go into the committable); a file smaller than one part is PUT whole under `_ratchet-staging/` |
//! | `commit` | `.<name>.pending` is renamed to `<name>`, directory fsynced; already renamed = done | CompleteMultipartUpload with `If-None-Match: *`, or CopyObject from staging + DeleteObject; an existing object of the right size (and part count) = done |
//! | `abort` | in-progress and pending files are deleted | uploads are aborted, staged objects deleted |
//!
//! # Failure table
//! | crash point | what recovery does |
//! |---|---|
//! | before pre-commit | deletes in-progress files / aborts uploads and deletes spill files; the source replays the records |
//! | after pre-commit, before the checkpoint record is durable | deletes pending files / aborts uploads, deletes staged objects (presumed abort); replay |
//! | after the record is durable, before or during commit | publishes the restored checkpoint's files (rename, complete, copy) |
//! | after commit | publishing again finds them visible: nothing changes |
//!
//! File names are `part-<sink>.<subtask>.<checkpoint>.<epoch>.<seq>.<ext>`, deterministic, so a retried commit
//! can never create a second visible copy.
//!
//! # Fencing
//! `recover` raises an owner epoch (`.ratchet-owner-<sink>.<subtask>` in the base directory, or
//! `<prefix>/_ratchet/owner-<sink>.<subtask>` written with S3 conditional writes). A zombie writes under its own
//! epoch's file names, so it never touches the current instance's files, and its committer refuses to publish
//! once the epoch moved on. (The epoch check and the publish are two steps: a zombie passing the check in the
//! instant before a new instance recovers can still publish one file of its own checkpoint.)
#![deny(missing_docs)]

mod commit;
mod committable;
mod config;
mod error;
mod factory;
mod format;
mod layout;
mod partition;
mod recovery;
mod schema;
mod sink;
mod storage;
mod types;

pub use commit::FileCommitter;
pub use committable::{FileCommittable, StagedFile, UploadedPart};
pub use config::{
    FileSinkConfig, FormatConfig, MIN_PART_SIZE, ParquetCompression, PartitionConfig,
    RollingPolicy, S3Config, StorageConfig, TimeGranularity, TimePartition,
};
pub use factory::{FileSinkFactory, FileSinkSettings};
pub use layout::FileName;
pub use sink::FileSink;
