//! The conformance kit for Ratchet sinks: the harness that proves, for any [`TwoPhaseCommit`] sink, that crashes
//! at any protocol step lose nothing and duplicate nothing ([`run_conformance`]); the in-memory
//! [`reference`](mod@reference) sink and deliberately broken variants of it that prove the harness; and the real
//! `kill -9` runner ([`kill9`]) a sink's crash test drives its sink through, process and all.
//!
//! Nothing here knows a server: a sink's tests bring their own destination and independent reader (Ratchet's own
//! tests get theirs from the `test-support` crate).
//!
//! A sink author supplies a [`ConformanceTarget`]: a factory for sink instances writing into an isolated
//! destination per scenario run, and an *independent* reader of what is visible there (a read_committed Kafka
//! consumer, psql, pyarrow, pyiceberg; never the sink's own code). [`run_conformance`] then runs every
//! [`Scenario`] through the real [`Driver`](connector_api::Driver) with a durable local checkpoint store, two
//! sinks side by side (`a` and `b`), crashing where the scenario says and replaying the source from the restored
//! positions after each crash, and checks:
//!
//! - after every restart, each sink shows exactly the records of the restored checkpoint, each once (nothing
//!   from a checkpoint that was not durable);
//! - at the end, after one more restart (a final recovery), each sink shows every source record exactly once and
//!   [`ConformanceTarget::leftovers`] reports nothing left behind;
//! - inspect matches recover: before every restart after a crash, the job is inspected (each sink's
//!   [`RecoveryPlan`](connector_api::RecoveryPlan), as `ratchet inspect` shows it); after the restart's recovery
//!   it is inspected again, and every planned commit must be visible (nothing left to commit) and every planned
//!   abort gone (nothing found open).
//!
//! Scenarios about single instances add a zombie, an abort, a repeated commit, and a foreign-subtask handover: a
//! recovery of subtask 0 handed the committables of subtask 1 (a takeover, as rescaling does) commits them once,
//! and subtask 1's own later recovery of the same checkpoint, or its zombie committing again, adds nothing.
//!
//! It prints a scenario × outcome table and returns a [`Report`].
//!
//! ```no_run
//! use async_trait::async_trait;
//! use connector_api::{Result, SinkId, SubtaskId};
//! use ratchet_conformance::{Conformance, ConformanceTarget, run_conformance};
//! use ratchet_conformance::reference::{ReferenceSink, ReferenceSystem};
//!
//! struct MyTarget(ReferenceSystem);
//!
//! #[async_trait]
//! impl ConformanceTarget for MyTarget {
//!     type Sink = ReferenceSink;
//!     async fn create_sink(&self, run: &str, sink: &SinkId, _subtask: SubtaskId) -> Result<ReferenceSink> {
//!         Ok(self.0.sink(run, sink))
//!     }
//!     async fn visible_ids(&self, run: &str, sink: &SinkId) -> Result<Vec<i64>> {
//!         Ok(self.0.visible(run, sink))
//!     }
//! }
//!
//! # async fn demo() {
//! let report = run_conformance("reference", &MyTarget(ReferenceSystem::new()), &Conformance::default()).await;
//! report.assert_passed();
//! # }
//! ```
//!
//! A crash here is in-process: the driver stops at the injected [`FaultPoint`](connector_api::FaultPoint) without
//! aborting or cleaning up anything and every sink instance is dropped, like a killed process (an in-flight
//! commit task is cancelled). [`kill9`] adds real `kill -9` runs on top.

#![deny(missing_docs)]

mod alone;
mod engine;
mod faults;
mod handover;
mod job;
pub mod kill9;
mod overlap;
pub mod reference;
mod report;
mod scenario;
mod source;
mod store;

use async_trait::async_trait;
use connector_api::{Result, SinkId, SubtaskId, TwoPhaseCommit};
use futures::StreamExt;

pub use report::{Report, ReportRow};
pub use scenario::{CrashAt, Scenario};
pub use source::{
    conformance_batch, conformance_batch_with, conformance_positions, conformance_schema,
};

/// Runs `sink` (built through a factory or the registry) through one job with a local checkpoint store in a
/// temporary directory: start, write the conformance records `0..records`, one checkpoint, close. For tests that
/// show a configured sink delivers; the caller reads the destination back with its independent reader.
///
/// # Panics
/// When any step fails (a test helper).
pub async fn run_one_checkpoint(sink: connector_api::DynSink, records: i64) {
    run_one_checkpoint_of(sink, &conformance_batch(0..records)).await;
}

/// [`run_one_checkpoint`] of `batch` (any schema: the one the sink was built for), its positions ending at its
/// row count.
///
/// # Panics
/// As [`run_one_checkpoint`].
pub async fn run_one_checkpoint_of(sink: connector_api::DynSink, batch: &arrow_array::RecordBatch) {
    let records = batch.num_rows() as i64;
    let state = tempfile::tempdir().expect("temporary checkpoint directory");
    let mut driver = connector_api::Driver::new(
        connector_api::LocalCheckpointStore::open(state.path(), 3).expect("checkpoint store"),
        connector_api::DriverConfig::default(),
    );
    let handle = driver.add_dyn_sink(sink).expect("add the sink");
    driver.start().await.expect("start");
    driver.write(handle, batch).await.expect("write");
    driver
        .checkpoint(conformance_positions(records))
        .await
        .expect("checkpoint");
    driver.close().await.expect("close");
}
pub use store::StoreBug;

/// A sink under test and an independent reader of its destination.
#[async_trait]
pub trait ConformanceTarget: Send + Sync {
    /// The sink type.
    type Sink: TwoPhaseCommit;

    /// A new instance of subtask `subtask` of sink `sink` writing into the destination of scenario run `run` (a
    /// directory, topic, table or prefix derived from `run`, isolated from every other run). Called for the first
    /// start, for every restart, and for zombies: instances of one run and sink share one destination, whatever
    /// their subtask (every scenario uses subtask 0, the handover scenario subtask 1 too). Batches have the
    /// schema [`conformance_schema`].
    async fn create_sink(&self, run: &str, sink: &SinkId, subtask: SubtaskId)
    -> Result<Self::Sink>;

    /// The `id` of every record visible in that destination to an ordinary reader, one entry per visible copy.
    async fn visible_ids(&self, run: &str, sink: &SinkId) -> Result<Vec<i64>>;

    /// What the sink left in that destination that recovery should have removed (staged files, open multipart
    /// uploads, lingering transactions), one description each. Checked after a final recovery at the end of every
    /// scenario; the default reports nothing.
    async fn leftovers(&self, _run: &str, _sink: &SinkId) -> Result<Vec<String>> {
        Ok(Vec::new())
    }
}

/// How large the runs are.
#[derive(Debug, Clone)]
pub struct Conformance {
    /// Source records per scenario (ids `0..records`).
    pub records: i64,
    /// Largest batch; sizes are drawn from `0..=max_batch`, so empty batches and empty checkpoints occur.
    pub max_batch: i64,
    /// Batches written per checkpoint.
    pub batches_per_checkpoint: u32,
    /// Seed of batch sizes and of the randomized runs.
    pub seed: u64,
    /// How many seeded randomized runs (random crash points over a longer run) to add.
    pub random_runs: u32,
    /// Records of each randomized run.
    pub random_records: i64,
    /// A deliberately broken checkpoint store, to prove the harness (`None` for every real run).
    pub store_bug: Option<StoreBug>,
    /// The sink makes a checkpoint's rows visible at pre-commit, idempotently (an upsert table, an append with a
    /// dedup table): after a restart or an abort it may already show records beyond the restored checkpoint, each
    /// at most once, which the replay then writes again with no further effect. The end state is checked exactly
    /// as for every sink. `false` for every transactional sink.
    pub visible_at_pre_commit: bool,
    /// How many scenarios run at once (at least 1). Every scenario writes into its own destination, so they
    /// cannot see each other; running several overlaps their waits on the servers (transaction round trips, the
    /// reader's polls), which is most of a run's time. The report lists them in [`Scenario::all`]'s order
    /// whatever order they finish in. A target whose reader blocks its thread should call it through
    /// `tokio::task::spawn_blocking`, or the scenarios wait for each other there.
    pub parallel_scenarios: usize,
}

impl Default for Conformance {
    fn default() -> Self {
        Self {
            records: 400,
            max_batch: 40,
            batches_per_checkpoint: 3,
            seed: 0x5EED,
            random_runs: 2,
            random_records: 1_500,
            store_bug: None,
            visible_at_pre_commit: false,
            parallel_scenarios: 4,
        }
    }
}

/// Runs every scenario against `target` ([`Conformance::parallel_scenarios`] at a time), prints the scenario × outcome table, and returns the report.
pub async fn run_conformance<T: ConformanceTarget>(
    name: &str,
    target: &T,
    config: &Conformance,
) -> Report {
    let rows = futures::stream::iter(Scenario::all(config))
        .map(|scenario| async move { engine::run(target, &scenario, config).await })
        .buffered(config.parallel_scenarios.max(1))
        .collect()
        .await;
    let report = Report {
        target: name.to_string(),
        rows,
    };
    println!("{report}");
    report
}

/// A name no other test run uses: `<prefix>-<pid>-<nanoseconds>`, for topics, tables, prefixes and directories.
pub fn unique_name(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{prefix}-{}-{nanos}", std::process::id())
}
