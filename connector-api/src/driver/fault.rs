//! Fault injection: the conformance harness crashes (or pauses) the driver at named protocol steps.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;

use crate::{CheckpointId, SinkId};

/// A step of the protocol at which a fault can be injected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FaultPoint {
    /// At start, after the claim and the load of the last record, before any sink recovers.
    AfterLoad,
    /// At start, *inside* `sink`'s `recover`: a crash here abandons the call after its first suspension (its first
    /// awaited external call), like a process killed mid-recovery.
    DuringRecover {
        /// The sink whose recovery is interrupted.
        sink: SinkId,
    },
    /// At start, after `sink` recovered; when other sinks follow, this is between the recoveries of two sinks;
    /// after the last, it is before the start record is saved (so the next start restores the same record).
    AfterRecover {
        /// The sink that just recovered.
        sink: SinkId,
    },
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
            FaultPoint::AfterLoad => f.write_str("after the claim and load"),
            FaultPoint::DuringRecover { sink } => write!(f, "during recover of {sink}"),
            FaultPoint::AfterRecover { sink } => write!(f, "after recover of {sink}"),
            FaultPoint::AfterPreCommit { sink } => write!(f, "after pre_commit of {sink}"),
            FaultPoint::AfterRecordDurable => f.write_str("after the checkpoint record is durable"),
            FaultPoint::AfterCommit { sink } => write!(f, "after commit of {sink}"),
        }
    }
}

/// What the driver does at a fault point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultAction {
    /// Go on.
    Continue,
    /// Stop at once, without aborting or cleaning up anything, like a killed process, and refuse every later call.
    Crash,
}

/// Decides, at each [`FaultPoint`] of each checkpoint, what the driver does there. It may also wait before
/// answering, which pauses the driver at that point (a harness uses this to interleave two instances, or to model
/// a process paused with SIGSTOP).
///
/// Any `Fn(CheckpointId, &FaultPoint) -> bool + Send + Sync` is a `Faults` that crashes where it returns `true`.
/// At start, the checkpoint passed is the one the start record will take.
#[async_trait]
pub trait Faults: Send + Sync {
    /// The action at `point` of `checkpoint`.
    async fn at(&self, checkpoint: CheckpointId, point: &FaultPoint) -> FaultAction;
}

#[async_trait]
impl<F> Faults for F
where
    F: Fn(CheckpointId, &FaultPoint) -> bool + Send + Sync,
{
    async fn at(&self, checkpoint: CheckpointId, point: &FaultPoint) -> FaultAction {
        if self(checkpoint, point) {
            FaultAction::Crash
        } else {
            FaultAction::Continue
        }
    }
}

/// A shared fault injector, for [`Driver::with_fault_injector`](crate::Driver::with_fault_injector).
pub type FaultInjector = Arc<dyn Faults>;
