//! The error every sink returns to the driver. The driver decides from [`ErrorKind`] alone whether to retry,
//! abort and replay, or stop; sink crates map their client errors into a kind at their boundary.
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

    /// Whether retrying the same step may succeed.
    pub fn is_retryable(&self) -> bool {
        self.kind == ErrorKind::Retryable
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

/// Displays an error and every cause in its source chain, `: `-separated, for logs and exit messages.
pub struct Report<'a>(pub &'a (dyn std::error::Error + 'static));

impl fmt::Display for Report<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut cause = self.0.source();
        while let Some(e) = cause {
            write!(f, ": {e}")?;
            cause = e.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
