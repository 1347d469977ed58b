//! A [`CheckpointStore`](connector_api::CheckpointStore) in PostgreSQL tables, shared by every worker of a job:
//! the store a job uses once it runs on more than one machine (the local store keeps records in a directory).
//!
//! - [`PgCheckpointStore`]: saves, loads and the committed mark (`store/mod.rs`);
//! - claims: the owner epoch and the claim guard session that fences a zombie (`store/claim.rs`);
//! - [`PgStoreLimits`]: how long each call and session may take.
//!
//! Connections are opened with [`connector_common::postgres::PgConnectOptions`] (libpq URLs, TLS, bounded
//! connects and keepalives).
#![deny(missing_docs)]

mod store;

pub use store::{PgCheckpointStore, PgStoreLimits};
