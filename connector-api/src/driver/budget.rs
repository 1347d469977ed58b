//! Timeout budgeting: refuse to start when a pre-committed transaction could expire before a restarted job
//! commits it.

use std::fmt;
use std::time::Duration;

use crate::{Error, ErrorKind, Phase, Result, SinkId};

/// The longest a transaction of checkpoint N can stay open when everything goes as badly as the configuration
/// allows, from `begin(N)` to its commit by a restarted job, term by term:
///
/// 1. writing N: the checkpoint interval, or the wait for checkpoint N-1's commit if that is longer (N-1 commits
///    while N is written, and N's record is saved only once N-1's commit finished): `max(interval, wait)`;
/// 2. saving N's record, with the store's retries: `wait`;
/// 3. committing N, which fails in the worst case: `wait` (every sink commits at once, each with its own retries,
///    so one slow sink does not delay another's commit);
/// 4. the restart: `max_restart_time`, or the take-over of a process that went silent if that is longer (another
///    process notices its lease expired and waits for its orphaned claim guard);
/// 5. recovery, which commits N: `max_recovery_time` (enforced: a longer recovery fails and restarts),
///
/// where `wait` is the retry policy's worst case with each call taking `max_call_time` (enforced for the store;
/// for a sink, as far as its client's own time-outs bound it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimeoutBudget {
    terms: Vec<(&'static str, Duration)>,
}

/// The numbers a [`TimeoutBudget`] is made of.
pub(super) struct BudgetInputs {
    pub(super) checkpoint_interval: Duration,
    pub(super) wait: Duration,
    pub(super) max_restart_time: Duration,
    pub(super) takeover_time: Duration,
    pub(super) max_recovery_time: Duration,
}

impl TimeoutBudget {
    pub(super) fn new(inputs: &BudgetInputs) -> Self {
        Self {
            terms: vec![
                (
                    "writing the checkpoint: checkpoint_interval, or the previous checkpoint's commit if longer",
                    inputs.checkpoint_interval.max(inputs.wait),
                ),
                (
                    "saving its record: the store's retries of max_call_time",
                    inputs.wait,
                ),
                (
                    "committing it: every sink at once, each with retries of max_call_time",
                    inputs.wait,
                ),
                (
                    "restarting: max_restart_time, or the take-over of a silent process (lease + lease / 5 + an \
                     orphaned claim guard's max_recovery_time) if longer",
                    inputs.max_restart_time.max(inputs.takeover_time),
                ),
                (
                    "recovering, which commits it: max_recovery_time",
                    inputs.max_recovery_time,
                ),
            ],
        }
    }

    /// The total: the longest a pre-committed transaction may wait for its commit.
    pub fn total(&self) -> Duration {
        self.terms.iter().map(|(_, d)| *d).sum()
    }

    /// Checks the budget against a sink's external transaction timeout (`None`: the sink's transactions do not
    /// expire).
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) naming the sink and every term.
    pub fn check(&self, sink: &SinkId, timeout: Option<Duration>) -> Result<()> {
        let Some(timeout) = timeout else {
            return Ok(());
        };
        let needed = self.total();
        if needed <= timeout {
            return Ok(());
        }
        Err(Error::new(
            ErrorKind::Config,
            Phase::Setup,
            format!(
                "the sink's transaction timeout ({timeout:?}) is shorter than the longest a pre-committed \
                 transaction may have to wait for its commit ({needed:?}: {}): a transaction pre-committed just \
                 before a crash would be aborted by the external system before the restarted job could commit it, \
                 losing its records. Raise the sink's transaction timeout (for Kafka: transaction_timeout, at most \
                 the broker's transaction.max.timeout.ms), or lower checkpoint_interval, max_call_time, the \
                 retries, max_restart_time, lease or max_recovery_time",
                self.terms
                    .iter()
                    .map(|(what, d)| format!("{what} {d:?}"))
                    .collect::<Vec<_>>()
                    .join(" + ")
            ),
        )
        .with_sink(sink))
    }
}

impl fmt::Display for TimeoutBudget {
    /// One line per term, then the total.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (what, duration) in &self.terms {
            writeln!(f, "  {:>9}  {what}", format!("{duration:?}"))?;
        }
        write!(
            f,
            "  {:>9}  in all: the longest a pre-committed transaction may wait for its commit",
            format!("{:?}", self.total())
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(
        interval: u64,
        wait: u64,
        restart: u64,
        takeover: u64,
        recovery: u64,
    ) -> TimeoutBudget {
        let secs = Duration::from_secs;
        TimeoutBudget::new(&BudgetInputs {
            checkpoint_interval: secs(interval),
            wait: secs(wait),
            max_restart_time: secs(restart),
            takeover_time: secs(takeover),
            max_recovery_time: secs(recovery),
        })
    }

    #[test]
    fn counts_the_commit_waits_restart_and_recovery() {
        assert_eq!(budget(60, 10, 300, 0, 30).total(), Duration::from_secs(410));
        // A previous commit that may take longer than the interval delays the record.
        assert_eq!(budget(5, 20, 100, 0, 10).total(), Duration::from_secs(170));
    }

    #[test]
    fn a_take_over_longer_than_the_restart_counts_instead() {
        // lease 12 min + 2.4 min + 60 s orphaned guard: longer than the 1 min restart.
        assert_eq!(
            budget(10, 150, 60, 12 * 60 + 144 + 60, 60).total(),
            Duration::from_secs(150 + 150 + 150 + 924 + 60)
        );
        let err = budget(10, 150, 60, 1068, 60)
            .check(
                &SinkId::new("kafka").unwrap(),
                Some(Duration::from_secs(600)),
            )
            .unwrap_err();
        assert!(err.to_string().contains("take-over"), "{err}");
    }

    #[test]
    fn refuses_a_budget_the_transaction_timeout_cannot_cover() {
        let sink = SinkId::new("kafka").unwrap();
        let secs = Duration::from_secs;
        let b = budget(60, 10, 300, 0, 30);
        assert!(b.check(&sink, None).is_ok());
        assert!(b.check(&sink, Some(secs(410))).is_ok());
        let err = b.check(&sink, Some(secs(409))).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config);
        let message = err.to_string();
        assert!(
            message.contains("sink kafka")
                && message.contains("max_restart_time")
                && message.contains("max_recovery_time"),
            "{message}"
        );
    }

    #[test]
    fn prints_a_line_per_term_and_the_total() {
        let text = budget(60, 10, 300, 0, 30).to_string();
        assert_eq!(text.lines().count(), 6, "{text}");
        assert!(text.lines().last().unwrap().contains("410s"), "{text}");
    }
}
