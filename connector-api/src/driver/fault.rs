//! Fault injection: the conformance harness crashes (or pauses) the driver at named protocol steps.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::task::Poll;

use async_trait::async_trait;

use crate::{CheckpointId, Error, ErrorKind, Phase, SinkId};

/// The named steps of the protocol where a crash can land: one vocabulary for the driver's fault points, the
/// conformance harness's scenarios, the real `kill -9` runs (`ratchet_conformance::kill9`) and the Kafka-to-Kafka pipeline's
/// hook. Names are kebab-case (`after-pre-commit`), for test specs and reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Step {
    /// At start, after the claim and the load of the last record.
    AfterLoad,
    /// At start, inside a sink's recover.
    DuringRecover,
    /// At start, after a sink recovered.
    AfterRecover,
    /// After a checkpoint's records were written (for Kafka-to-Kafka: produced and flushed), before pre-commit.
    AfterWrite,
    /// After a sink pre-committed (for Kafka-to-Kafka: the offsets are in the transaction), before the decision.
    AfterPreCommit,
    /// After the checkpoint record is durable, before any commit.
    AfterRecordDurable,
    /// After a sink committed.
    AfterCommit,
    /// While a commit runs on its task and the next checkpoint is being written.
    WhileCommitting,
    /// At a schema change, after every earlier checkpoint committed, before any sink took the new schema.
    BeforeEvolve,
    /// At a schema change, after a sink took the new schema.
    AfterEvolve,
}

impl Step {
    /// Every step, in protocol order.
    pub const ALL: [Step; 10] = [
        Step::AfterLoad,
        Step::DuringRecover,
        Step::AfterRecover,
        Step::AfterWrite,
        Step::AfterPreCommit,
        Step::AfterRecordDurable,
        Step::AfterCommit,
        Step::WhileCommitting,
        Step::BeforeEvolve,
        Step::AfterEvolve,
    ];

    /// The step's kebab-case name.
    pub const fn name(self) -> &'static str {
        match self {
            Step::AfterLoad => "after-load",
            Step::DuringRecover => "during-recover",
            Step::AfterRecover => "after-recover",
            Step::AfterWrite => "after-write",
            Step::AfterPreCommit => "after-pre-commit",
            Step::AfterRecordDurable => "after-record-durable",
            Step::AfterCommit => "after-commit",
            Step::WhileCommitting => "while-committing",
            Step::BeforeEvolve => "before-evolve",
            Step::AfterEvolve => "after-evolve",
        }
    }

    /// The step named `name`.
    pub fn parse(name: &str) -> Option<Step> {
        Step::ALL.into_iter().find(|s| s.name() == name)
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A step of the protocol at which the driver asks its [`Faults`] what to do, with the sink concerned.
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
    /// At a schema change, after every earlier checkpoint committed, before any sink took the new schema.
    BeforeEvolve,
    /// At a schema change, after `sink` took the new schema; when other sinks follow, between two sinks.
    AfterEvolve {
        /// The sink that just took the new schema.
        sink: SinkId,
    },
}

impl FaultPoint {
    /// The step this point is at.
    pub fn step(&self) -> Step {
        match self {
            FaultPoint::AfterLoad => Step::AfterLoad,
            FaultPoint::DuringRecover { .. } => Step::DuringRecover,
            FaultPoint::AfterRecover { .. } => Step::AfterRecover,
            FaultPoint::AfterPreCommit { .. } => Step::AfterPreCommit,
            FaultPoint::AfterRecordDurable => Step::AfterRecordDurable,
            FaultPoint::AfterCommit { .. } => Step::AfterCommit,
            FaultPoint::BeforeEvolve => Step::BeforeEvolve,
            FaultPoint::AfterEvolve { .. } => Step::AfterEvolve,
        }
    }

    /// The sink concerned, for the points that are about one sink.
    pub fn sink(&self) -> Option<&SinkId> {
        match self {
            FaultPoint::DuringRecover { sink }
            | FaultPoint::AfterRecover { sink }
            | FaultPoint::AfterPreCommit { sink }
            | FaultPoint::AfterCommit { sink }
            | FaultPoint::AfterEvolve { sink } => Some(sink),
            FaultPoint::AfterLoad | FaultPoint::AfterRecordDurable | FaultPoint::BeforeEvolve => {
                None
            }
        }
    }
}

impl fmt::Display for FaultPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.sink() {
            Some(sink) => write!(f, "{} of {sink}", self.step()),
            None => write!(f, "{}", self.step()),
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

/// Polls `future` once: its output if it finished, `None` if it suspended (and is then dropped).
pub(super) async fn first_poll<F: Future>(future: F) -> Option<F::Output> {
    let mut future = std::pin::pin!(future);
    std::future::poll_fn(|cx| {
        Poll::Ready(match future.as_mut().poll(cx) {
            Poll::Ready(output) => Some(output),
            Poll::Pending => None,
        })
    })
    .await
}

pub(super) fn crash_error(point: &FaultPoint) -> Error {
    Error::new(
        ErrorKind::Fatal,
        Phase::Checkpoint,
        format!("injected crash {point}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_names_round_trip_and_points_know_their_step() {
        for step in Step::ALL {
            assert_eq!(Step::parse(step.name()), Some(step));
        }
        assert_eq!(Step::parse("after-nothing"), None);
        let sink = SinkId::new("a").unwrap();
        let point = FaultPoint::AfterPreCommit { sink: sink.clone() };
        assert_eq!(point.step(), Step::AfterPreCommit);
        assert_eq!(point.sink(), Some(&sink));
        assert_eq!(point.to_string(), "after-pre-commit of a");
        assert_eq!(
            FaultPoint::AfterRecordDurable.to_string(),
            "after-record-durable"
        );
    }
}
