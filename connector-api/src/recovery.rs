//! Recovery as a plan: what a sink's recovery will commit, abort and fence, computed read-only
//! ([`TwoPhaseCommit::plan_recovery`]), rendered by `ratchet inspect`, and carried out by
//! [`TwoPhaseCommit::execute_recovery`]. Inspect and recover cannot disagree: they are one computation.

use crate::{CheckpointId, Committer, OpenTransaction, Phase, Resolution, Result};

#[cfg(doc)]
use crate::TwoPhaseCommit;

/// When a sink's recovery fences older instances of its subtask, relative to committing the restored checkpoint.
/// Either order is allowed by the contract (see [`TwoPhaseCommit`], "Contract"): what matters is that nothing a
/// zombie can still prepare survives recovery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FenceOrder {
    /// Fence first, then commit: a zombie's commits are refused from the start (file and Iceberg sinks: the
    /// owner epoch is raised, and commits check it).
    BeforeCommit,
    /// Commit first, then fence: the fence would abort the restored transactions (Kafka: `init_transactions`
    /// aborts what is open on the id) or the commit needs the old owner (JDBC: the owner row is raised once
    /// the prepared transactions are resolved).
    AfterCommit,
    /// Nothing to fence: the sink keeps no transaction outside the process.
    Nothing,
}

/// How a sink's recovery fences older instances of its subtask.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    /// Before or after the commit.
    pub order: FenceOrder,
    /// What it does, for an operator (`raise the owner epoch of subtask 0 in table db.t`).
    pub how: String,
}

impl Fence {
    /// No fencing: the sink keeps nothing outside the process between checkpoints.
    pub fn nothing() -> Self {
        Self {
            order: FenceOrder::Nothing,
            how: "nothing to fence".into(),
        }
    }
}

/// What one sink's recovery of one subtask will do.
///
/// `commit` is exact: recovery commits these committables, and nothing else. `found` is what the external system
/// holds open at planning time, each with what recovery does with it; recovery also aborts anything of the
/// subtask a zombie left open after the plan was made (it was not fenced yet), so every `found` item marked
/// [`Abort`](Resolution::Abort) is gone afterwards and every one marked [`Commit`](Resolution::Commit) is visible.
#[derive(Debug, Clone)]
pub struct RecoveryPlan<C> {
    /// The restored checkpoint (`None`: a fresh start, or a checkpoint with nothing left to do for this sink).
    pub checkpoint: Option<CheckpointId>,
    /// The restored committables the external system does not show as committed yet: recovery commits them.
    pub commit: Vec<C>,
    /// How many restored committables the external system already shows committed ([`Committer::is_committed`]):
    /// recovery leaves them alone.
    pub already_committed: usize,
    /// What the external system holds open for the subtask, each with its resolution.
    pub found: Vec<OpenTransaction>,
    /// How recovery fences older instances.
    pub fence: Fence,
    /// Anything else an operator should know (what the external system records as last committed, a subtask
    /// taken over from another).
    pub notes: Vec<String>,
}

impl<C: Send + Sync + 'static> RecoveryPlan<C> {
    /// The start of every plan: the restored committables split by [`Committer::is_committed`] into what
    /// recovery commits and what is already visible; nothing found yet, no notes.
    ///
    /// # Errors
    /// What `is_committed` reports when the external system cannot be read (or cannot tell any more), in
    /// [`Phase::Recover`], with the restored checkpoint.
    pub async fn checking<K: Committer<Committable = C>>(
        committer: &K,
        restored: Option<(CheckpointId, Vec<C>)>,
        fence: Fence,
    ) -> Result<Self> {
        let (checkpoint, committables) = match restored {
            Some((checkpoint, committables)) => (Some(checkpoint), committables),
            None => (None, Vec::new()),
        };
        let mut commit = Vec::new();
        let mut already_committed = 0;
        for committable in committables {
            let committed = committer.is_committed(&committable).await.map_err(|e| {
                let e = e.at_phase(Phase::Recover);
                match checkpoint {
                    Some(checkpoint) => e.or_checkpoint(checkpoint),
                    None => e,
                }
            })?;
            if committed {
                already_committed += 1;
            } else {
                commit.push(committable);
            }
        }
        Ok(Self {
            checkpoint,
            commit,
            already_committed,
            found: Vec::new(),
            fence,
            notes: Vec::new(),
        })
    }
}

impl<C> RecoveryPlan<C> {
    /// The same plan over another committable type (for adapters such as
    /// [`GuaranteedSink`](crate::GuaranteedSink)).
    pub fn map<D>(self, f: impl FnMut(C) -> D) -> RecoveryPlan<D> {
        RecoveryPlan {
            checkpoint: self.checkpoint,
            commit: self.commit.into_iter().map(f).collect(),
            already_committed: self.already_committed,
            found: self.found,
            fence: self.fence,
            notes: self.notes,
        }
    }

    /// The plan without its committables, for display.
    pub fn summary(&self) -> PlanSummary {
        PlanSummary {
            checkpoint: self.checkpoint,
            commits: self.commit.len(),
            already_committed: self.already_committed,
            found: self.found.clone(),
            fence: self.fence.clone(),
            notes: self.notes.clone(),
        }
    }

    /// The found items recovery aborts.
    pub fn aborts(&self) -> impl Iterator<Item = &OpenTransaction> {
        self.found
            .iter()
            .filter(|t| t.resolution == Resolution::Abort)
    }
}

impl<C> RecoveryPlan<Option<C>> {
    /// The plan over optional committables (an adapter's, where `None` holds nothing to commit) as a plan over the
    /// committables that exist.
    pub fn flatten(self) -> RecoveryPlan<C> {
        RecoveryPlan {
            checkpoint: self.checkpoint,
            commit: self.commit.into_iter().flatten().collect(),
            already_committed: self.already_committed,
            found: self.found,
            fence: self.fence,
            notes: self.notes,
        }
    }
}

/// A [`RecoveryPlan`] without its committables: what `ratchet inspect` prints per sink and subtask.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanSummary {
    /// The restored checkpoint.
    pub checkpoint: Option<CheckpointId>,
    /// How many committables recovery commits.
    pub commits: usize,
    /// How many restored committables are already visible.
    pub already_committed: usize,
    /// What the external system holds open, each with its resolution.
    pub found: Vec<OpenTransaction>,
    /// How recovery fences.
    pub fence: Fence,
    /// Notes for the operator.
    pub notes: Vec<String>,
}
