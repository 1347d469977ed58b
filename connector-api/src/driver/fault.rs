//! Fault injection: the conformance harness crashes the driver at named protocol steps.

use std::fmt;
use std::sync::Arc;

use crate::{CheckpointId, SinkId};

/// A step of the checkpoint protocol at which a crash can be injected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FaultPoint {
    /// After `sink` pre-committed, before the checkpoint record is durable.
    AfterPreCommit {
        /// The sink that just pre-committed.
        sink: SinkId,
    },
    /// After the checkpoint record is durable, before any sink committed.
    AfterRecordDurable,
    /// After `sink` committed; when other sinks follow, this is between the commits of two sinks.
    AfterCommit {
        /// The sink that just committed.
        sink: SinkId,
    },
}

impl fmt::Display for FaultPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FaultPoint::AfterPreCommit { sink } => write!(f, "after pre_commit of {sink}"),
            FaultPoint::AfterRecordDurable => f.write_str("after the checkpoint record is durable"),
            FaultPoint::AfterCommit { sink } => write!(f, "after commit of {sink}"),
        }
    }
}

/// Decides, at each [`FaultPoint`] of each checkpoint, whether the driver crashes there (`true`). A crashed driver
/// stops at once, without aborting or cleaning up anything, like a killed process, and refuses every later call.
pub type FaultInjector = Arc<dyn Fn(CheckpointId, &FaultPoint) -> bool + Send + Sync>;
