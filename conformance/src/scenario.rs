//! The scenarios the harness runs, and where a crash lands.

use connector_api::{CheckpointId, SinkId, Step};

use super::Conformance;

/// Where a scenario crashes: a [`Step`] of the protocol, at sink `a` or `b` where the step is about one sink
/// ([`CrashAt::point`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashAt {
    /// At start, after sink `a` recovered and before sink `b` did.
    BetweenRecoveries,
    /// At start, inside sink `b`'s recover (after its first external call).
    InsideRecover,
    /// At start, after both sinks recovered, before the start record is saved: the next start recovers the same
    /// record again.
    AfterRecovery,
    /// After the checkpoint's batches were written, before `checkpoint` is called.
    AfterWrite,
    /// After sink `a` pre-committed (sink `b` has not).
    AfterFirstPreCommit,
    /// After both sinks pre-committed, before the record is durable.
    AfterLastPreCommit,
    /// After the record is durable, before any commit.
    AfterRecordDurable,
    /// After sink `a` committed, before sink `b` did.
    BetweenCommits,
    /// After both sinks committed.
    AfterCommit,
}

/// One conformance scenario.
#[derive(Debug, Clone)]
pub enum Scenario {
    /// No crash; commits overlap the next checkpoint's writes.
    HappyPath,
    /// One crash at a step of the job's second checkpoint.
    Crash(CrashAt),
    /// A crash after the record is durable, then a restart that recovers and dies before saving its start record:
    /// recovery runs twice over the same record (the harness checks that both restarts restored the same one).
    RecoverTwice,
    /// Two instances start at once and the second overtakes the first's slow recovery: the first pauses after
    /// loading the last record (as if stopped with SIGSTOP) until the second has decided a checkpoint, which the
    /// second holds uncommitted until the first's start is over. Nothing may be lost or doubled, and the instance
    /// that lost the claim may not decide a checkpoint.
    TwoStarters,
    /// An instance pauses after pre-committing checkpoint 3 (before saving its record); a new instance starts,
    /// recovers, and is held at the end of its recovery while the paused one resumes and tries to save and commit
    /// (with a fencing store that save waits for the new instance's claim guard, then is refused). The zombie may
    /// not decide anything, and nothing may be lost or doubled.
    ZombieSaves,
    /// An instance pauses after claiming and loading (before recovering anything); its claim lapses while it is
    /// paused (as a PostgreSQL guard session the server ended); a second instance claims, recovers and decides a
    /// checkpoint, which it holds uncommitted while the first resumes. The first one's recovery must stop without
    /// touching anything (it would abort the second's decided transactions), and nothing may be lost or doubled.
    LapsedClaim,
    /// Saving checkpoint 3's record stores it but reports an unknown outcome, on every attempt: the driver must
    /// stop without aborting, and recovery must commit the checkpoint.
    SaveInDoubt,
    /// After the job completes, a new instance recovers the last checkpoint (committing it again) and its
    /// committer commits the same committables once more.
    CommitTwice,
    /// An instance that began writing before a new instance recovered keeps writing, pre-committing and
    /// committing: none of it may become visible.
    Zombie,
    /// An instance writes and pre-commits, then aborts: nothing of it may become visible.
    Abort,
    /// Subtask 1 pre-commits every record in one checkpoint and stops before committing; a recovery of subtask 0
    /// is handed subtask 1's committables (a takeover, as rescaling does) and must commit them, once; then the
    /// first subtask-1 instance, still alive, commits them again, and a new instance of subtask 1 recovers the same
    /// checkpoint: neither may add a row.
    ForeignSubtaskHandover,
    /// A long run with crashes at random steps, from a seed.
    Random {
        /// The seed; the same seed replays the same run.
        seed: u64,
    },
}

impl Scenario {
    /// Every scenario a conformance run covers.
    pub fn all(config: &Conformance) -> Vec<Scenario> {
        let mut all = vec![
            Scenario::HappyPath,
            Scenario::Crash(CrashAt::AfterWrite),
            Scenario::Crash(CrashAt::AfterFirstPreCommit),
            Scenario::Crash(CrashAt::AfterLastPreCommit),
            Scenario::Crash(CrashAt::AfterRecordDurable),
            Scenario::Crash(CrashAt::BetweenCommits),
            Scenario::Crash(CrashAt::AfterCommit),
            Scenario::Crash(CrashAt::BetweenRecoveries),
            Scenario::Crash(CrashAt::InsideRecover),
            Scenario::RecoverTwice,
            Scenario::TwoStarters,
            Scenario::ZombieSaves,
            Scenario::LapsedClaim,
            Scenario::SaveInDoubt,
            Scenario::CommitTwice,
            Scenario::Zombie,
            Scenario::Abort,
            Scenario::ForeignSubtaskHandover,
        ];
        all.extend((0..config.random_runs).map(|i| Scenario::Random {
            seed: config.seed.wrapping_add(u64::from(i) + 1),
        }));
        all
    }

    /// A short name for reports and destinations.
    pub fn name(&self) -> String {
        match self {
            Scenario::HappyPath => "happy-path".into(),
            Scenario::Crash(at) => format!("crash-{}", crash_name(*at)),
            Scenario::RecoverTwice => "recover-twice".into(),
            Scenario::TwoStarters => "two-starters".into(),
            Scenario::ZombieSaves => "zombie-saves".into(),
            Scenario::LapsedClaim => "lapsed-claim".into(),
            Scenario::SaveInDoubt => "save-in-doubt".into(),
            Scenario::CommitTwice => "commit-twice".into(),
            Scenario::Zombie => "zombie".into(),
            Scenario::Abort => "abort".into(),
            Scenario::ForeignSubtaskHandover => "foreign-subtask-handover".into(),
            Scenario::Random { seed } => format!("random-{seed:x}"),
        }
    }
}

impl CrashAt {
    /// The protocol step, and which of the two sinks (`a` = 0, `b` = 1) when the step is about one.
    pub fn point(self) -> (Step, Option<usize>) {
        match self {
            CrashAt::BetweenRecoveries => (Step::AfterRecover, Some(0)),
            CrashAt::InsideRecover => (Step::DuringRecover, Some(1)),
            CrashAt::AfterRecovery => (Step::AfterRecover, Some(1)),
            CrashAt::AfterWrite => (Step::AfterWrite, None),
            CrashAt::AfterFirstPreCommit => (Step::AfterPreCommit, Some(0)),
            CrashAt::AfterLastPreCommit => (Step::AfterPreCommit, Some(1)),
            CrashAt::AfterRecordDurable => (Step::AfterRecordDurable, None),
            CrashAt::BetweenCommits => (Step::AfterCommit, Some(0)),
            CrashAt::AfterCommit => (Step::AfterCommit, Some(1)),
        }
    }
}

fn crash_name(at: CrashAt) -> &'static str {
    match at {
        CrashAt::BetweenRecoveries => "between-recoveries",
        CrashAt::InsideRecover => "inside-recover",
        CrashAt::AfterRecovery => "after-recovery",
        CrashAt::AfterWrite => "after-write",
        CrashAt::AfterFirstPreCommit => "after-first-pre-commit",
        CrashAt::AfterLastPreCommit => "after-last-pre-commit",
        CrashAt::AfterRecordDurable => "after-record-durable",
        CrashAt::BetweenCommits => "between-commits",
        CrashAt::AfterCommit => "after-commit",
    }
}

/// Counters of one scenario run.
#[derive(Default)]
pub(super) struct Stats {
    pub(super) crashes: u32,
    pub(super) starts: u32,
    pub(super) checkpoints: u64,
    /// The checkpoint each start restores (loaded just before it starts).
    pub(super) restored: Vec<Option<CheckpointId>>,
    /// Restarts whose recovery was checked against the plan inspect made before it.
    pub(super) plans_checked: u32,
}

/// The two sinks every scenario runs side by side.
pub(super) fn sinks() -> [SinkId; 2] {
    [
        SinkId::new("a").expect("valid"),
        SinkId::new("b").expect("valid"),
    ]
}
