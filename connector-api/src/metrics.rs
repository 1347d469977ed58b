//! The protocol's metrics, named here and recorded by the [`Driver`](crate::Driver), so a Rust job that embeds the
//! library and the `ratchet` worker report the same series, through whatever `metrics` recorder the process
//! installs (none installed: nothing is recorded). Every series carries the labels given to
//! [`Driver::with_metric_labels`](crate::Driver::with_metric_labels) (the worker: `subtask`).
//!
//! | metric | type | extra labels | meaning |
//! |---|---|---|---|
//! | `ratchet_checkpoints_total` | counter | | checkpoints decided (their record durable) |
//! | `ratchet_checkpoint_seconds` | histogram | | from the start of a checkpoint to its record being durable: every sink's pre-commit, the previous checkpoint's commit if still running, the save |
//! | `ratchet_commit_seconds` | histogram | `sink` | one sink's commit of one decided checkpoint, from the record being durable to the commit returning: the latency until the checkpoint is visible there |
//! | `ratchet_ignored_values_total` | counter | `sink`, `column` | values (not nulls) of columns a sink with `evolution = "ignore"` left out: its table lacks them |
//! | `ratchet_pending_commit_age_seconds` | gauge | | age of the decided checkpoint still committing (0: none), set by [`Driver::record_pending_commit_age`](crate::Driver::record_pending_commit_age) |

/// Checkpoints decided.
pub const CHECKPOINTS: &str = "ratchet_checkpoints_total";
/// Seconds from the start of a checkpoint to its record being durable.
pub const CHECKPOINT_SECONDS: &str = "ratchet_checkpoint_seconds";
/// Seconds of one sink's commit of one checkpoint, label `sink`.
pub const COMMIT_SECONDS: &str = "ratchet_commit_seconds";
/// Age in seconds of the decided checkpoint whose commit still runs (0: none).
pub const PENDING_COMMIT_AGE: &str = "ratchet_pending_commit_age_seconds";
/// Values (nulls not counted) of the columns a sink with `evolution = "ignore"` left out, labels `sink` and
/// `column`.
pub const IGNORED_VALUES: &str = "ratchet_ignored_values_total";
