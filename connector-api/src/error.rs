//! The error every sink returns to the driver, and what the driver does about it.
//!
//! Sink crates map their client errors into an [`ErrorKind`] at their boundary, and say in which protocol
//! [`Phase`] it happened. The driver decides what to do from (kind, phase) alone, in one place, [`action`]:
//!
//! | kind \ phase | setup, recover | begin | write | pre_commit | checkpoint (saving the record) | commit | abort |
//! |---|---|---|---|---|---|---|---|
//! | `Config` | stop | stop | stop | stop | stop | stop | stop |
//! | `Retryable` | retry, then stop | retry, then stop | abort and replay | abort and replay | retry, then abort and replay | retry, then stop | retry, then stop |
//! | `InDoubt` | retry, then stop | retry, then stop | abort and replay | abort and replay | retry, then stop without aborting | retry, then stop | retry, then stop |
//! | `MustAbort` | stop | abort and replay | abort and replay | abort and replay | abort and replay | stop | stop |
//! | `Fenced` | stop without aborting | stop without aborting | stop without aborting | stop without aborting | stop without aborting | stop without aborting | stop without aborting |
//! | `BadRecord` | stop | abort and replay | dead-letter (the batch was refused whole) | abort and replay | abort and replay | stop | stop |
//! | `Fatal`, `Bug` | stop | abort and replay | abort and replay | abort and replay | abort and replay | stop | stop |
//!
//! "Abort and replay" discards the open checkpoint in every sink and stops the driver: the next start replays from
//! the last durable checkpoint. "Stop" after the record is durable leaves the decision standing: the next start's
//! recovery commits it. "Stop without aborting" is for an instance that lost its claim, or a decision whose
//! outcome is unknown: recovery, by whoever owns the job, decides. "Dead-letter" leaves the driver usable; the
//! caller routes the batch (or stops, as it is configured).
//!
//! Convention: the message never repeats the source's text; [`Error::source`](std::error::Error::source) carries it.
//! Print errors with [`Report`] (or `{:#}` through anyhow) to see the whole chain.

use std::fmt;

use crate::{CheckpointId, SinkId};

/// Result with a Ratchet [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What the driver should do about an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The configuration is wrong; nothing was written. Fix the named setting and restart.
    Config,
    /// A transient failure (network, throttling, coordinator moving): retry the same step with backoff.
    Retryable,
    /// The open transaction is lost but nothing is decided: abort it and replay from the last checkpoint.
    MustAbort,
    /// Another instance took over this sink's transactions; this instance must stop writing at once.
    Fenced,
    /// Input that cannot be written (schema mismatch, value out of range); names the record. Only returned when
    /// nothing of the refused batch entered the transaction, so the caller may dead-letter or drop it.
    BadRecord,
    /// The step's outcome is unknown (a reply was lost after the request may have taken effect). Retry the step if
    /// it is idempotent; otherwise stop *without* aborting anything and let recovery find out what happened.
    InDoubt,
    /// Anything else: stop the job. Unclassified errors are fatal.
    Fatal,
    /// A violated invariant inside Ratchet: stop the job and report it.
    Bug,
}

/// What the driver does about an error; see the table in the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Try the same step again after a backoff (the step is idempotent); when retries run out, the action of the
    /// same error without retry applies ([`action_after_retries`]).
    Retry,
    /// Discard the open checkpoint in every sink and stop; the next start replays it.
    AbortAndReplay,
    /// Stop; what is decided stays decided, and the next start's recovery finishes it.
    Stop,
    /// Stop and abort nothing: another instance owns the job, or the outcome is unknown.
    StopWithoutAbort,
    /// The batch was refused whole and nothing else changed: the caller dead-letters it (or stops), and the
    /// driver stays usable.
    DeadLetter,
}

/// What the driver does about an error of `kind` in `phase`: the table in the module docs.
pub fn action(kind: ErrorKind, phase: Phase) -> Action {
    use Phase::{Abort, Begin, Checkpoint, Commit, PreCommit, Recover, Setup, Write};
    match (kind, phase) {
        (ErrorKind::Fenced, _) => Action::StopWithoutAbort,
        (ErrorKind::Config, _) => Action::Stop,
        (
            ErrorKind::Retryable | ErrorKind::InDoubt,
            Setup | Recover | Begin | Checkpoint | Commit | Abort,
        ) => Action::Retry,
        (ErrorKind::BadRecord, Write) => Action::DeadLetter,
        (_, Setup | Recover | Commit | Abort) => Action::Stop,
        (_, Begin | Write | PreCommit | Checkpoint) => Action::AbortAndReplay,
    }
}

/// What the driver does about an error of `kind` in `phase` once retrying it is over (or not allowed).
pub fn action_after_retries(kind: ErrorKind, phase: Phase) -> Action {
    match (action(kind, phase), kind, phase) {
        (Action::Retry, ErrorKind::InDoubt, Phase::Checkpoint) => Action::StopWithoutAbort,
        (Action::Retry, _, Phase::Checkpoint) => Action::AbortAndReplay,
        (Action::Retry, _, _) => Action::Stop,
        (other, _, _) => other,
    }
}

/// The protocol step that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Reading or validating configuration, connecting.
    Setup,
    /// `begin`: opening a transaction.
    Begin,
    /// `write`: writing records into the open transaction.
    Write,
    /// `pre_commit`: flushing and preparing the transaction.
    PreCommit,
    /// Persisting or loading a checkpoint record.
    Checkpoint,
    /// `commit`: making a prepared transaction visible.
    Commit,
    /// `abort`: discarding a transaction.
    Abort,
    /// `recover`: finishing what a crashed attempt left behind.
    Recover,
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Phase::Setup => "setup",
            Phase::Begin => "begin",
            Phase::Write => "write",
            Phase::PreCommit => "pre_commit",
            Phase::Checkpoint => "checkpoint",
            Phase::Commit => "commit",
            Phase::Abort => "abort",
            Phase::Recover => "recover",
        })
    }
}

/// An error from a sink or the checkpoint machinery, with what the driver needs to act on it and what an operator
/// needs to find it: the sink, the checkpoint and the external transaction handle.
#[derive(Debug)]
pub struct Error {
    kind: ErrorKind,
    phase: Phase,
    message: String,
    sink: Option<SinkId>,
    checkpoint: Option<CheckpointId>,
    txn: Option<String>,
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

impl Error {
    /// A new error of `kind` in `phase`. The message says what went wrong and, where it helps, what to do.
    pub fn new(kind: ErrorKind, phase: Phase, message: impl Into<String>) -> Self {
        Self {
            kind,
            phase,
            message: message.into(),
            sink: None,
            checkpoint: None,
            txn: None,
            source: None,
        }
    }

    /// A [`Config`](ErrorKind::Config) error found while setting up (a setting is wrong: the message names it and
    /// says what to change).
    pub fn config(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Config, Phase::Setup, message)
    }

    /// The error with `what` (where it was found: a setting, a file) put before its message, as `what: message`.
    pub fn context(mut self, what: impl fmt::Display) -> Self {
        self.message = format!("{what}: {}", self.message);
        self
    }

    /// A [`Bug`](ErrorKind::Bug) in `phase`: an invariant of Ratchet's own code does not hold.
    pub fn bug(phase: Phase, message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Bug, phase, message)
    }

    /// The same error reclassified as `kind`, keeping its message, context and source: for a caller that knows
    /// better than the helper that raised it (a refused write that is a bad record here, a retryable failure that
    /// is fatal once retries ran out).
    pub fn with_kind(mut self, kind: ErrorKind) -> Self {
        self.kind = kind;
        self
    }

    /// Names the sink the error belongs to.
    pub fn with_sink(mut self, sink: &SinkId) -> Self {
        self.sink = Some(sink.clone());
        self
    }

    /// Names the checkpoint the error belongs to.
    pub fn with_checkpoint(mut self, checkpoint: CheckpointId) -> Self {
        self.checkpoint = Some(checkpoint);
        self
    }

    /// Names the sink unless the error already names one.
    pub fn or_sink(self, sink: &SinkId) -> Self {
        if self.sink.is_some() {
            self
        } else {
            self.with_sink(sink)
        }
    }

    /// Names the checkpoint unless the error already names one.
    pub fn or_checkpoint(self, checkpoint: CheckpointId) -> Self {
        if self.checkpoint.is_some() {
            self
        } else {
            self.with_checkpoint(checkpoint)
        }
    }

    /// Names the external transaction (transactional id, file, upload id, xid).
    pub fn with_txn(mut self, txn: impl Into<String>) -> Self {
        self.txn = Some(txn.into());
        self
    }

    /// Names the external transaction unless the error already names one (which is the more precise).
    pub fn or_txn(self, txn: impl Into<String>) -> Self {
        if self.txn.is_some() {
            self
        } else {
            self.with_txn(txn)
        }
    }

    /// Sets the protocol step: for helpers shared by several steps, the caller knows which one it is in.
    pub fn at_phase(mut self, phase: Phase) -> Self {
        self.phase = phase;
        self
    }

    /// Attaches an already boxed underlying cause.
    pub fn with_boxed_source(
        mut self,
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    ) -> Self {
        self.source = Some(source);
        self
    }

    /// Attaches the underlying cause.
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }

    /// What the driver should do.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The protocol step that failed.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// The sink, if known.
    pub fn sink(&self) -> Option<&SinkId> {
        self.sink.as_ref()
    }

    /// The checkpoint, if known.
    pub fn checkpoint(&self) -> Option<CheckpointId> {
        self.checkpoint
    }

    /// The external transaction handle, if known.
    pub fn txn(&self) -> Option<&str> {
        self.txn.as_deref()
    }

    /// What the driver does about this error ([`action`]).
    pub fn action(&self) -> Action {
        action(self.kind, self.phase)
    }

    /// Whether retrying the same step may succeed ([`Action::Retry`]): what the driver goes by, from the kind and
    /// the phase.
    pub fn is_retryable(&self) -> bool {
        self.action() == Action::Retry
    }

    /// Whether the same *call* may succeed if repeated ([`Retryable`](ErrorKind::Retryable) or
    /// [`InDoubt`](ErrorKind::InDoubt)), whatever the phase: for a sink retrying one idempotent call inside a step
    /// the driver does not retry ([`RetryPolicy::run_idempotent`](crate::RetryPolicy::run_idempotent)). Whether
    /// repeating is safe is the caller's to know.
    pub fn is_transient(&self) -> bool {
        matches!(self.kind, ErrorKind::Retryable | ErrorKind::InDoubt)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed", self.phase)?;
        if let Some(sink) = &self.sink {
            write!(f, " for sink {sink}")?;
        }
        if let Some(checkpoint) = self.checkpoint {
            write!(f, " at checkpoint {checkpoint}")?;
        }
        if let Some(txn) = &self.txn {
            write!(f, " (txn {txn})")?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.as_deref().map(|e| e as _)
    }
}

/// An infrastructure error (TLS files, PostgreSQL connections, S3 credentials) as a protocol error in
/// [`Phase::Setup`]: [`Config`](connector_common::ErrorKind::Config) stays [`Config`](ErrorKind::Config),
/// [`Unavailable`](connector_common::ErrorKind::Unavailable) becomes [`Retryable`](ErrorKind::Retryable). Set
/// the phase with [`Error::at_phase`] when the call was part of another step. Message and source are kept apart.
impl From<connector_common::Error> for Error {
    fn from(e: connector_common::Error) -> Self {
        let kind = match e.kind() {
            connector_common::ErrorKind::Config => ErrorKind::Config,
            _ => ErrorKind::Retryable,
        };
        let message = e.message().to_string();
        let error = Error::new(kind, Phase::Setup, message);
        match e.into_source() {
            Some(source) => error.with_boxed_source(source),
            None => error,
        }
    }
}

/// Displays an error and every cause in its source chain, `: `-separated, for logs and exit messages. A cause
/// whose text the error before it already ends with is not printed again: some libraries' errors print their
/// cause in their own message *and* return it as their source (tokio-postgres: `db error: ERROR: x`, then
/// `ERROR: x`), which a plain chain would show twice.
pub struct Report<'a>(pub &'a (dyn std::error::Error + 'static));

impl fmt::Display for Report<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut shown = self.0.to_string();
        f.write_str(&shown)?;
        let mut cause = self.0.source();
        while let Some(e) = cause {
            let text = e.to_string();
            if !shown.ends_with(&text) {
                write!(f, ": {text}")?;
            }
            shown = text;
            cause = e.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error that prints its cause in its own message and returns it as its source too.
    #[derive(Debug)]
    struct Wrapping(std::io::Error);

    impl fmt::Display for Wrapping {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "db error: {}", self.0)
        }
    }

    impl std::error::Error for Wrapping {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn a_report_says_each_cause_once() {
        let cause = Wrapping(std::io::Error::other(
            "ERROR: relation \"t\" does not exist",
        ));
        let error = Error::new(ErrorKind::Config, Phase::Setup, "the table t does not fit")
            .with_source(cause);
        assert_eq!(
            Report(&error).to_string(),
            "setup failed: the table t does not fit: db error: ERROR: relation \"t\" does not exist"
        );
    }

    #[test]
    fn the_action_table_holds_for_the_dangerous_cells() {
        use Action::*;
        assert_eq!(
            action(ErrorKind::Fenced, Phase::PreCommit),
            StopWithoutAbort
        );
        assert_eq!(
            action(ErrorKind::Fenced, Phase::Checkpoint),
            StopWithoutAbort
        );
        assert_eq!(action(ErrorKind::InDoubt, Phase::Checkpoint), Retry);
        assert_eq!(
            action_after_retries(ErrorKind::InDoubt, Phase::Checkpoint),
            StopWithoutAbort
        );
        assert_eq!(
            action_after_retries(ErrorKind::Retryable, Phase::Checkpoint),
            AbortAndReplay
        );
        assert_eq!(action(ErrorKind::Retryable, Phase::Commit), Retry);
        assert_eq!(
            action_after_retries(ErrorKind::Retryable, Phase::Commit),
            Stop
        );
        assert_eq!(action(ErrorKind::Fatal, Phase::Commit), Stop);
        assert_eq!(action(ErrorKind::BadRecord, Phase::Write), DeadLetter);
        assert_eq!(
            action(ErrorKind::BadRecord, Phase::PreCommit),
            AbortAndReplay
        );
        assert_eq!(action(ErrorKind::Retryable, Phase::Write), AbortAndReplay);
        assert_eq!(action(ErrorKind::MustAbort, Phase::Write), AbortAndReplay);
        assert_eq!(action(ErrorKind::Config, Phase::Begin), Stop);
    }

    /// Every cell of the table in the module docs (what docs.rs shows) against [`action`] and
    /// [`action_after_retries`]: the documentation cannot drift from the code.
    #[test]
    fn the_documented_action_table_is_the_code_cell_by_cell() {
        let source = include_str!("error.rs");
        let rows: Vec<Vec<String>> = source
            .lines()
            .filter_map(|l| l.strip_prefix("//! | "))
            .map(|l| {
                l.trim_end_matches(" |")
                    .split(" | ")
                    .map(str::to_string)
                    .collect()
            })
            .collect();
        let header = &rows[0];
        let phases: Vec<Vec<Phase>> = header[1..]
            .iter()
            .map(|h| match h.as_str() {
                "setup, recover" => vec![Phase::Setup, Phase::Recover],
                "begin" => vec![Phase::Begin],
                "write" => vec![Phase::Write],
                "pre_commit" => vec![Phase::PreCommit],
                "checkpoint (saving the record)" => vec![Phase::Checkpoint],
                "commit" => vec![Phase::Commit],
                "abort" => vec![Phase::Abort],
                other => panic!("unknown column {other:?}"),
            })
            .collect();
        let mut cells = 0;
        for row in rows.iter().skip(1) {
            let kinds: Vec<ErrorKind> = match row[0].as_str() {
                "`Config`" => vec![ErrorKind::Config],
                "`Retryable`" => vec![ErrorKind::Retryable],
                "`InDoubt`" => vec![ErrorKind::InDoubt],
                "`MustAbort`" => vec![ErrorKind::MustAbort],
                "`Fenced`" => vec![ErrorKind::Fenced],
                "`BadRecord`" => vec![ErrorKind::BadRecord],
                "`Fatal`, `Bug`" => vec![ErrorKind::Fatal, ErrorKind::Bug],
                other => panic!("unknown row {other:?}"),
            };
            for (cell, phases) in row[1..].iter().zip(&phases) {
                let (first, after) = match cell.as_str() {
                    "stop" => (Action::Stop, Action::Stop),
                    "stop without aborting" => (Action::StopWithoutAbort, Action::StopWithoutAbort),
                    "abort and replay" => (Action::AbortAndReplay, Action::AbortAndReplay),
                    "dead-letter (the batch was refused whole)" => {
                        (Action::DeadLetter, Action::DeadLetter)
                    }
                    "retry, then stop" => (Action::Retry, Action::Stop),
                    "retry, then abort and replay" => (Action::Retry, Action::AbortAndReplay),
                    "retry, then stop without aborting" => {
                        (Action::Retry, Action::StopWithoutAbort)
                    }
                    other => panic!("unknown cell {other:?}"),
                };
                for kind in &kinds {
                    for phase in phases {
                        assert_eq!(action(*kind, *phase), first, "{kind:?} in {phase:?}");
                        assert_eq!(
                            action_after_retries(*kind, *phase),
                            after,
                            "{kind:?} in {phase:?} after retries"
                        );
                        cells += 1;
                    }
                }
            }
        }
        // Every kind in every phase.
        assert_eq!(cells, 8 * 8);
    }

    #[test]
    fn display_names_sink_checkpoint_and_txn_and_report_walks_the_chain() {
        let io = std::io::Error::other("disk full");
        let err = Error::new(
            ErrorKind::Fatal,
            Phase::Commit,
            "rename of pending file failed",
        )
        .with_sink(&SinkId::new("files").unwrap())
        .with_checkpoint(CheckpointId(7))
        .with_txn("part-7-0.parquet")
        .with_source(io);
        assert_eq!(
            err.to_string(),
            "commit failed for sink files at checkpoint 7 (txn part-7-0.parquet): rename of pending file failed"
        );
        assert!(Report(&err).to_string().ends_with(": disk full"));
    }
}
