//! A reference sink over an in-memory transactional system, existing only to prove the conformance harness: the
//! correct sink passes it, and each [`Broken`] variant must make it fail.
//!
//! The in-memory system is modelled on Kafka's transactions: each sink instance writes through one of two
//! transaction slots (`checkpoint % 2`, like a transactional-id pool), an open or prepared transaction stays on its
//! slot until committed or aborted, a `begin` on a slot that still holds a transaction continues it (like reusing a
//! transactional id whose transaction was never aborted), and `recover` raises the sink's epoch, fencing older
//! instances.
//!
//! [`ReferenceSystem::persistent`] keeps the system's state in a file instead, so that it outlives a process: the
//! `kill -9` runner's own tests use it to show the runner catches what the harness catches.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arrow_array::{Int64Array, RecordBatch};
use async_trait::async_trait;
use connector_api::{
    CheckpointId, Committer, Error, ErrorKind, Fence, FenceOrder, OpenTransaction, Phase,
    RecoveryPlan, Resolution, Result, SinkId, TwoPhaseCommit,
};
use serde::{Deserialize, Serialize};

/// A deliberate bug, to show the harness catches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Broken {
    /// `commit` of an already-committed transaction makes its rows visible again.
    NonIdempotentCommit,
    /// `recover` commits the restored transactions but leaves other lingering ones open.
    RecoverForgetsAbort,
    /// `pre_commit` does not flush the client-side buffer into the transaction (those rows are lost).
    PreCommitNoFlush,
    /// Nothing checks the epoch: a zombie instance can still write and commit.
    ZombieNotFenced,
    /// `recover` notes the restored checkpoint as recovered *before* committing it, and a later `recover` of the
    /// same checkpoint skips the commit: a crash inside recovery loses it.
    RecoverCommitsOnlyOnce,
    /// `is_committed` always answers `false`: a recovery plan never sees that its commits happened.
    BlindIsCommitted,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Txn {
    checkpoint: u64,
    rows: Vec<i64>,
    prepared: bool,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct SinkState {
    epoch: u64,
    slots: HashMap<u64, Txn>,
    committed: HashMap<u64, Vec<i64>>,
    visible: Vec<i64>,
    /// Checkpoints a recovery started on (only [`Broken::RecoverCommitsOnlyOnce`] reads it).
    recovering: HashSet<u64>,
}

/// The in-memory "external system": committed rows per (run, sink), transactions, epochs.
#[derive(Clone, Default)]
pub struct ReferenceSystem {
    state: Arc<Mutex<HashMap<(String, SinkId), SinkState>>>,
    broken: Option<Broken>,
    transaction_timeout: Option<Duration>,
    /// While set, commits never answer (a server that stopped replying without closing anything).
    silent_commits: Arc<std::sync::atomic::AtomicBool>,
    /// The file the state lives in, for a system that outlives a process.
    file: Option<Arc<std::path::PathBuf>>,
}

/// The state of a persistent system, as stored in its file.
type Stored = Vec<((String, SinkId), SinkState)>;

impl ReferenceSystem {
    /// A correct system.
    pub fn new() -> Self {
        Self::default()
    }

    /// A system whose sinks have `bug`.
    pub fn broken(bug: Broken) -> Self {
        Self {
            broken: Some(bug),
            ..Self::default()
        }
    }

    /// A system (correct, or with `bug`) whose state lives in `file`: read before and written (replaced
    /// atomically) after every operation, so that a process killed at any moment leaves it as a real server
    /// would, and the next process sees it. For one process at a time.
    pub fn persistent(file: impl Into<std::path::PathBuf>, bug: Option<Broken>) -> Self {
        Self {
            broken: bug,
            file: Some(Arc::new(file.into())),
            ..Self::default()
        }
    }

    /// The transactions still open or prepared for `sink` in run `run`, one description each.
    pub fn open_transactions(&self, run: &str, sink: &SinkId) -> Vec<String> {
        self.with(&(run.to_string(), sink.clone()), |state| {
            let mut open: Vec<String> = state
                .slots
                .iter()
                .map(|(slot, txn)| format!("slot {slot}: checkpoint {}", txn.checkpoint))
                .collect();
            open.sort();
            open
        })
    }

    /// A system whose sinks declare `timeout` as their transaction timeout (for the driver's timeout budget).
    pub fn with_transaction_timeout(mut self, timeout: Duration) -> Self {
        self.transaction_timeout = Some(timeout);
        self
    }

    /// While `silent`, every commit waits forever without answering, as against a server that stopped replying
    /// (shared by every sink and committer of this system).
    pub fn silence_commits(&self, silent: bool) {
        self.silent_commits
            .store(silent, std::sync::atomic::Ordering::SeqCst);
    }

    /// A new sink instance for `sink` in run `run`.
    pub fn sink(&self, run: &str, sink: &SinkId) -> ReferenceSink {
        ReferenceSink {
            system: self.clone(),
            key: (run.to_string(), sink.clone()),
            epoch: 0,
            current: None,
            buffer: Vec::new(),
        }
    }

    /// Ids visible for `sink` in run `run`, one entry per visible copy.
    pub fn visible(&self, run: &str, sink: &SinkId) -> Vec<i64> {
        self.with(&(run.to_string(), sink.clone()), |state| {
            state.visible.clone()
        })
    }

    fn with<R>(&self, key: &(String, SinkId), f: impl FnOnce(&mut SinkState) -> R) -> R {
        let mut state = self.state.lock().expect("reference state");
        if let Some(file) = &self.file {
            *state = load(file);
        }
        let result = f(state.entry(key.clone()).or_default());
        if let Some(file) = &self.file {
            store(file, &state);
        }
        result
    }

    fn is(&self, bug: Broken) -> bool {
        self.broken == Some(bug)
    }
}

/// The state in `file` (empty when there is none yet).
fn load(file: &std::path::Path) -> HashMap<(String, SinkId), SinkState> {
    match std::fs::read(file) {
        Ok(bytes) => serde_json::from_slice::<Stored>(&bytes)
            .expect("a reference system's state file")
            .into_iter()
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => HashMap::new(),
        Err(e) => panic!("cannot read {}: {e}", file.display()),
    }
}

/// Replaces `file` with `state` (a rename, so a kill leaves the old state or the new one).
fn store(file: &std::path::Path, state: &HashMap<(String, SinkId), SinkState>) {
    let stored: Vec<(&(String, SinkId), &SinkState)> = state.iter().collect();
    let bytes = serde_json::to_vec(&stored).expect("reference state as JSON");
    let temporary = file.with_extension("tmp");
    std::fs::write(&temporary, bytes)
        .and_then(|()| std::fs::rename(&temporary, file))
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", file.display()));
}

/// What commits one reference transaction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReferenceCommittable {
    /// The checkpoint of the transaction.
    pub checkpoint: u64,
}

/// One instance of a reference sink.
pub struct ReferenceSink {
    system: ReferenceSystem,
    key: (String, SinkId),
    epoch: u64,
    current: Option<u64>,
    /// Rows written but not yet flushed into the transaction (a client-side buffer).
    buffer: Vec<i64>,
}

/// Commits reference transactions; fenced when a newer instance recovered.
#[derive(Clone)]
pub struct ReferenceCommitter {
    system: ReferenceSystem,
    key: (String, SinkId),
    epoch: u64,
}

fn fenced(key: &(String, SinkId), phase: Phase) -> Error {
    Error::new(
        ErrorKind::Fenced,
        phase,
        "a newer instance recovered this sink",
    )
    .with_sink(&key.1)
}

fn slot(checkpoint: u64) -> u64 {
    checkpoint % 2
}

#[async_trait]
impl Committer for ReferenceCommitter {
    type Committable = ReferenceCommittable;

    async fn commit(&self, committables: Vec<ReferenceCommittable>) -> Result<()> {
        let system = &self.system;
        if system
            .silent_commits
            .load(std::sync::atomic::Ordering::SeqCst)
        {
            std::future::pending::<()>().await;
        }
        system.with(&self.key, |state| {
            if state.epoch != self.epoch && !system.is(Broken::ZombieNotFenced) {
                return Err(fenced(&self.key, Phase::Commit));
            }
            for c in committables {
                if let Some(rows) = state.committed.get(&c.checkpoint) {
                    if system.is(Broken::NonIdempotentCommit) {
                        let rows = rows.clone();
                        state.visible.extend(rows);
                    }
                    continue;
                }
                let matches = state
                    .slots
                    .get(&slot(c.checkpoint))
                    .is_some_and(|t| t.checkpoint == c.checkpoint && t.prepared);
                if !matches {
                    return Err(Error::new(
                        ErrorKind::Fatal,
                        Phase::Commit,
                        "the prepared transaction is gone (aborted?): its rows are lost",
                    )
                    .with_sink(&self.key.1)
                    .with_checkpoint(CheckpointId(c.checkpoint)));
                }
                let txn = state
                    .slots
                    .remove(&slot(c.checkpoint))
                    .expect("checked above");
                state.visible.extend(txn.rows.iter().copied());
                state.committed.insert(c.checkpoint, txn.rows);
            }
            Ok(())
        })
    }

    async fn is_committed(&self, committable: &ReferenceCommittable) -> Result<bool> {
        if self.system.is(Broken::BlindIsCommitted) {
            return Ok(false);
        }
        Ok(self.system.with(&self.key, |state| {
            state.committed.contains_key(&committable.checkpoint)
        }))
    }
}

impl ReferenceSink {
    fn check_epoch(&self, state: &SinkState, phase: Phase) -> Result<()> {
        if state.epoch != self.epoch && !self.system.is(Broken::ZombieNotFenced) {
            return Err(fenced(&self.key, phase));
        }
        Ok(())
    }
}

#[async_trait]
impl TwoPhaseCommit for ReferenceSink {
    type Committable = ReferenceCommittable;
    type Committer = ReferenceCommitter;

    fn sink_id(&self) -> &SinkId {
        &self.key.1
    }

    fn transaction_timeout(&self) -> Option<Duration> {
        self.system.transaction_timeout
    }

    fn committer(&self) -> ReferenceCommitter {
        ReferenceCommitter {
            system: self.system.clone(),
            key: self.key.clone(),
            epoch: self.epoch,
        }
    }

    async fn begin(&mut self, checkpoint: CheckpointId) -> Result<()> {
        let system = self.system.clone();
        system.with(&self.key, |state| {
            self.check_epoch(state, Phase::Begin)?;
            // A transaction still on the slot is continued: only recovery's abort clears a lingering one.
            let txn = state.slots.entry(slot(checkpoint.0)).or_default();
            txn.checkpoint = checkpoint.0;
            txn.prepared = false;
            Ok::<_, Error>(())
        })?;
        self.current = Some(checkpoint.0);
        self.buffer.clear();
        Ok(())
    }

    async fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        let ids = batch
            .column_by_name("id")
            .and_then(|c| c.as_any().downcast_ref::<Int64Array>())
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::BadRecord,
                    Phase::Write,
                    "batch has no Int64 column \"id\"",
                )
            })?;
        let system = self.system.clone();
        system.with(&self.key, |state| self.check_epoch(state, Phase::Write))?;
        self.buffer.extend(ids.values().iter().copied());
        Ok(())
    }

    async fn pre_commit(&mut self, checkpoint: CheckpointId) -> Result<ReferenceCommittable> {
        let rows = std::mem::take(&mut self.buffer);
        let system = self.system.clone();
        system.with(&self.key, |state| {
            self.check_epoch(state, Phase::PreCommit)?;
            let txn = state.slots.entry(slot(checkpoint.0)).or_default();
            if !system.is(Broken::PreCommitNoFlush) {
                txn.rows.extend(rows);
            }
            txn.checkpoint = checkpoint.0;
            txn.prepared = true;
            Ok::<_, Error>(())
        })?;
        Ok(ReferenceCommittable {
            checkpoint: checkpoint.0,
        })
    }

    async fn abort(&mut self) -> Result<()> {
        self.buffer.clear();
        if let Some(checkpoint) = self.current.take() {
            self.system.with(&self.key, |state| {
                if state.epoch == self.epoch {
                    state.slots.remove(&slot(checkpoint));
                }
            });
        }
        Ok(())
    }

    /// Found: the transactions on the slots (open or prepared). Fence before commit: the epoch is raised.
    async fn plan_recovery(
        &mut self,
        restored: Option<(CheckpointId, Vec<ReferenceCommittable>)>,
    ) -> Result<RecoveryPlan<ReferenceCommittable>> {
        let fence = Fence {
            order: FenceOrder::BeforeCommit,
            how: "raise the sink's epoch".into(),
        };
        let mut plan = RecoveryPlan::checking(&self.committer(), restored, fence).await?;
        let held: HashSet<u64> = plan.commit.iter().map(|c| c.checkpoint).collect();
        plan.found = self.system.with(&self.key, |state| {
            state
                .slots
                .iter()
                .map(|(slot, txn)| OpenTransaction {
                    name: format!("slot {slot}"),
                    checkpoint: Some(CheckpointId(txn.checkpoint)),
                    state: if txn.prepared { "prepared" } else { "open" }.into(),
                    age: None,
                    resolution: Resolution::held_by_restored(
                        txn.prepared && held.contains(&txn.checkpoint),
                    ),
                })
                .collect()
        });
        Ok(plan)
    }

    async fn execute_recovery(&mut self, plan: RecoveryPlan<ReferenceCommittable>) -> Result<()> {
        self.buffer.clear();
        self.current = None;
        self.epoch = self.system.with(&self.key, |state| {
            state.epoch += 1;
            state.epoch
        });
        if let Some(checkpoint) = plan.checkpoint {
            let committables = plan.commit;
            let first_time = self
                .system
                .with(&self.key, |state| state.recovering.insert(checkpoint.0));
            // A round trip to the external system: a crash inside recovery lands here.
            tokio::task::yield_now().await;
            if first_time || !self.system.is(Broken::RecoverCommitsOnlyOnce) {
                self.committer().commit(committables).await?;
            }
        }
        tokio::task::yield_now().await;
        if !self.system.is(Broken::RecoverForgetsAbort) {
            // Everything still on a slot belongs to a checkpoint that never became durable.
            self.system.with(&self.key, |state| state.slots.clear());
        }
        Ok(())
    }
}
