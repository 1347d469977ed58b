//! What a sink holds in its external system between a crash and the next recovery, for `ratchet inspect`: the
//! open, prepared or staged transactions of one subtask, how old each is, and what recovery will do with it.

use std::time::Duration;

use crate::{CheckpointId, Loaded, SinkId};

/// What recovery does with a transaction it finds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    /// Commit it: the last durable checkpoint record holds it (the checkpoint is decided).
    Commit,
    /// Abort (roll back, delete) it: no durable checkpoint record holds it (presumed abort).
    Abort,
}

impl Resolution {
    /// What recovery does with a transaction: commit it when the restored checkpoint holds it, abort it otherwise
    /// (presumed abort).
    pub fn held_by_restored(held: bool) -> Self {
        if held { Self::Commit } else { Self::Abort }
    }
}

impl std::fmt::Display for Resolution {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Commit => "commit (its checkpoint record is durable)",
            Self::Abort => "abort (no durable checkpoint holds it)",
        })
    }
}

/// One transaction (or staged piece of one) a sink holds open in its external system.
#[derive(Debug, Clone, PartialEq)]
pub struct OpenTransaction {
    /// The external system's name for it: a prepared transaction's global id, a transactional id, a staged file
    /// or an open multipart upload.
    pub name: String,
    /// The checkpoint it belongs to, when known.
    pub checkpoint: Option<CheckpointId>,
    /// Its state in the external system (`prepared`, `Ongoing`, `pending file`, ...).
    pub state: String,
    /// How long it has been open, when the external system says.
    pub age: Option<Duration>,
    /// What recovery will do with it.
    pub resolution: Resolution,
}

/// One subtask as [`Driver::inspect`](crate::Driver::inspect) sees it: the checkpoint store's view and each sink's.
#[derive(Debug)]
pub struct Inspection {
    /// What the store holds.
    pub store: Loaded,
    /// Each sink's view.
    pub sinks: Vec<SinkInspection>,
    /// Why the next start would refuse to recover, if it would: the last checkpoint holds work of a sink the job
    /// no longer has, or a sink's external system is ahead of the store.
    pub refusal: Option<crate::Error>,
}

/// One sink of an [`Inspection`].
#[derive(Debug)]
pub struct SinkInspection {
    /// The sink.
    pub sink: SinkId,
    /// How long its external system keeps a transaction open before aborting it by itself (`None`: never).
    pub timeout: Option<Duration>,
    /// What its recovery would do, or why its external system could not be read.
    pub plan: crate::Result<crate::PlanSummary>,
}
