//! Timeout budgeting: refuse to start when a pre-committed transaction could expire before a restarted job
//! commits it.

use std::time::Duration;

use crate::{Error, ErrorKind, Phase, Result, SinkId};

/// The longest a transaction of checkpoint N can stay open when everything goes as badly as the configuration
/// allows, from `begin(N)` to its commit by a restarted job:
///
/// - the checkpoint interval, or the wait for checkpoint N-1's commit if that is longer (N-1 commits while N is
///   written, and N's record is saved only once N-1's commit finished): `max(interval, wait)`;
/// - saving N's record: `wait`;
/// - committing N, which fails in the worst case: `wait`;
/// - the restart: `max_restart_time`;
/// - recovery, which commits N: `max_recovery_time`,
///
/// where `wait` is the retry policy's worst case with each call taking `max_call_time`.
pub(super) struct Budget {
    pub(super) checkpoint_interval: Duration,
    pub(super) wait: Duration,
    pub(super) max_restart_time: Duration,
    pub(super) max_recovery_time: Duration,
}

impl Budget {
    /// The total, see the type's docs.
    pub(super) fn needed(&self) -> Duration {
        self.checkpoint_interval.max(self.wait)
            + self.wait * 2
            + self.max_restart_time
            + self.max_recovery_time
    }

    /// Checks the budget against a sink's external transaction timeout.
    pub(super) fn check(&self, sink: &SinkId, timeout: Option<Duration>) -> Result<()> {
        let Some(timeout) = timeout else {
            return Ok(());
        };
        let needed = self.needed();
        if needed <= timeout {
            return Ok(());
        }
        Err(Error::new(
            ErrorKind::Config,
            Phase::Setup,
            format!(
                "the sink's transaction timeout ({timeout:?}) is shorter than the longest a pre-committed \
                 transaction may have to wait for its commit ({needed:?}: checkpoint_interval {:?} or the previous \
                 commit's wait, + saving the record and committing, each up to {:?} with retries of max_call_time, \
                 + max_restart_time {:?} + max_recovery_time {:?}): a transaction pre-committed just before a crash \
                 would be aborted by the external system before the restarted job could commit it, losing its \
                 records. Raise the sink's transaction timeout (for Kafka: transaction_timeout, at most the broker's \
                 transaction.max.timeout.ms), or lower checkpoint_interval, the retries, max_restart_time or \
                 max_recovery_time",
                self.checkpoint_interval, self.wait, self.max_restart_time, self.max_recovery_time
            ),
        )
        .with_sink(sink))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(interval: u64, wait: u64, restart: u64, recovery: u64) -> Budget {
        let secs = Duration::from_secs;
        Budget {
            checkpoint_interval: secs(interval),
            wait: secs(wait),
            max_restart_time: secs(restart),
            max_recovery_time: secs(recovery),
        }
    }

    #[test]
    fn counts_the_commit_waits_restart_and_recovery() {
        assert_eq!(budget(60, 10, 300, 30).needed(), Duration::from_secs(410));
        // A previous commit that may take longer than the interval delays the record.
        assert_eq!(budget(5, 20, 100, 10).needed(), Duration::from_secs(170));
    }

    #[test]
    fn refuses_a_budget_the_transaction_timeout_cannot_cover() {
        let sink = SinkId::new("kafka").unwrap();
        let secs = Duration::from_secs;
        let b = budget(60, 10, 300, 30);
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
}
