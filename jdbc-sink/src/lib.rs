//! Exactly-once relational sink over prepared (XA-style) transactions.
//!
//! This release has the PostgreSQL transaction machinery the sink stands on: deterministic transaction ids
//! ([`Xid`]), prepare / commit-prepared / rollback-prepared with idempotent commit, listing the prepared
//! transactions a sink instance owns, and a commit marker that answers "was this transaction committed?" even
//! after the prepared transaction is gone ([`PgPreparedTransactions`]).
//!
//! # Mechanism
//! Each checkpoint's rows are written in one transaction that also inserts a marker row
//! `(sink, subtask, checkpoint)` into `ratchet_commits`, then `PREPARE TRANSACTION '<xid>'` makes it durable and
//! detaches it from the session. Any session can `COMMIT PREPARED` it later. If the prepared transaction is gone,
//! the marker row tells committed (row present) from rolled back (row absent). PostgreSQL needs
//! `max_prepared_transactions > 0` (the test server runs with 128).
//!
//! # Failure table
//! | crash point | state in PostgreSQL | recovery |
//! |---|---|---|
//! | before `PREPARE` | the session's transaction is rolled back by the server | nothing to do; replay |
//! | after `PREPARE`, before the checkpoint record is durable | prepared, not in the record | `ROLLBACK PREPARED` |
//! | after the record is durable, before `COMMIT PREPARED` | prepared, in the record | `COMMIT PREPARED` |
//! | after `COMMIT PREPARED` | gone, marker row present | nothing: already committed |
#![deny(missing_docs)]

mod pg;
mod xid;

pub use pg::{CommitOutcome, PgPreparedTransactions};
pub use xid::Xid;
