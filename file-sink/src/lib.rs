//! Exactly-once file sink: files are written hidden, made durable at pre-commit, and made visible by an atomic
//! rename at commit.
//!
//! This release has the local-filesystem backend writing Parquet ([`LocalParquetSink`]).
//!
//! # Guarantee
//! Every record written between two checkpoints lands in exactly one visible file, once that checkpoint's record is
//! durable. Readers that ignore hidden (dot-prefixed) files never see partial or aborted output.
//!
//! # Mechanism
//! | step | what happens on disk |
//! |---|---|
//! | `write` | rows go to `.<name>.inprogress` (hidden) |
//! | `pre_commit` | the file is closed, fsynced, renamed to `.<name>.pending`, directory fsynced |
//! | `commit` | `.<name>.pending` is renamed to `<name>`, directory fsynced; already renamed = done |
//! | `abort` | the in-progress file is deleted |
//!
//! # Failure table
//! | crash point | what recovery does |
//! |---|---|
//! | before pre-commit | deletes the in-progress file; the source replays its records |
//! | after pre-commit, before the checkpoint record is durable | deletes the pending file (presumed abort); replay |
//! | after the record is durable, before or during commit | renames the pending file into place |
//! | after commit | nothing: the file is visible and the record says so; the commit is not repeated twice |
//!
//! File names are `part-<sink>.<subtask>.<checkpoint>.<epoch>.<seq>.parquet`, deterministic, so a retried commit
//! can never create a second visible copy.
//!
//! # Fencing
//! `recover` raises an owner epoch kept in `.ratchet-owner-<sink>.<subtask>`; an older instance (a zombie) writes
//! under its own epoch's file names, so it never touches the current instance's files, and its committer refuses
//! to publish once the epoch moved on.
#![deny(missing_docs)]

mod layout;
mod local;
mod owner;

pub use layout::FileName;
pub use local::{
    FileCommittable, LocalCommitter, LocalParquetSink, LocalParquetSinkConfig, PendingFile,
};
