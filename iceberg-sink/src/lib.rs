//! Exactly-once Iceberg sink: every checkpoint becomes at most one atomic snapshot.
//!
//! This release has the commit path the sink stands on: opening a catalog from config ([`CatalogConfig`]),
//! writing Arrow batches into Parquet data files for a table ([`write_data_files`]), and committing one
//! checkpoint's data files as one snapshot that records the sink and checkpoint in its summary, idempotently
//! ([`commit_checkpoint`], [`last_committed_checkpoint`]).
//!
//! # Mechanism
//! The snapshot summary carries `ratchet.sink-id` and `ratchet.checkpoint-id`. Before committing checkpoint N,
//! the sink reloads the table and walks the current snapshot's ancestry: if it finds a snapshot of this sink with
//! checkpoint >= N, the commit already happened (a crash after the catalog accepted it) and is not repeated.
//! Data files written for a checkpoint that never commits are unreferenced: invisible to every reader.
//!
//! # Failure table
//! | crash point | table state | recovery |
//! |---|---|---|
//! | before pre-commit | orphan data files, no snapshot | nothing visible; replay |
//! | after pre-commit (files listed in the committable), before the record is durable | orphan files | nothing visible; replay |
//! | after the record is durable, before the catalog commit | no snapshot for N | commit N's files |
//! | after the catalog commit | snapshot for N | ancestry shows N: skip |
#![deny(missing_docs)]

mod commit;
mod config;
mod error;
mod writer;

pub use commit::{
    CHECKPOINT_PROPERTY, CommitOutcome, SINK_PROPERTY, commit_checkpoint, last_committed_checkpoint,
};
pub use config::CatalogConfig;
pub use writer::write_data_files;
