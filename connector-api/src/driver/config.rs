//! How the driver runs checkpoints: the checkpoint interval, the time limits it enforces and the timeout budget
//! they add up to.

use std::time::Duration;

use super::budget::{BudgetInputs, TimeoutBudget};
use crate::RetryPolicy;

/// How the driver runs checkpoints.
#[derive(Debug, Clone)]
pub struct DriverConfig {
    /// How often the caller checkpoints. The driver does not time checkpoints itself: the caller calls
    /// [`Driver::checkpoint`](super::Driver::checkpoint); the driver uses this for the timeout budget.
    pub checkpoint_interval: Duration,
    /// The longest a crashed job may take to be restarted (for the timeout budget).
    pub max_restart_time: Duration,
    /// The longest recovery may take once the job restarted: enforced (a longer recovery fails, and the next start
    /// tries again), and a term of the timeout budget.
    pub max_recovery_time: Duration,
    /// How long other processes take to pick up a subtask of a process that went silent (its lease expires, its
    /// orphaned claim guard is ended): a term of the timeout budget when longer than `max_restart_time`. Zero for
    /// a job that runs in one process.
    pub takeover_time: Duration,
    /// The longest one sink or store call may take, enforced: a sink's `pre_commit` is abandoned after it (the
    /// checkpoint is aborted and replayed), its `begin` and `commit`, retries included, after the retry policy's
    /// worst case of it (a commit abandoned so stops the driver, and recovery commits the checkpoint); a store
    /// bounds its own calls by it (`checkpoint_postgres::PgStoreLimits`). Writes are not bounded: they wait for the sink's
    /// backpressure. An `abort` is abandoned after it (recovery aborts what is left).
    pub max_call_time: Duration,
    /// Retries of transient failures in begin, commit, recover and checkpoint-store calls.
    pub retry: RetryPolicy,
}

impl Default for DriverConfig {
    /// 10 s checkpoint interval, 60 s restart and 60 s recovery budget, 15 s per call, default retries: a budget
    /// of about 8.5 min, inside the Kafka sink's default 10 min transaction timeout.
    fn default() -> Self {
        Self {
            checkpoint_interval: Duration::from_secs(10),
            max_restart_time: Duration::from_secs(60),
            max_recovery_time: Duration::from_secs(60),
            max_call_time: Duration::from_secs(15),
            takeover_time: Duration::ZERO,
            retry: RetryPolicy::default(),
        }
    }
}

impl DriverConfig {
    /// The timeout budget of this configuration: the longest a pre-committed transaction may wait for its
    /// commit, term by term (`ratchet check-config` prints it).
    pub fn budget(&self) -> TimeoutBudget {
        TimeoutBudget::new(&BudgetInputs {
            checkpoint_interval: self.checkpoint_interval,
            wait: self.retry.worst_case(self.max_call_time),
            max_restart_time: self.max_restart_time,
            takeover_time: self.takeover_time,
            max_recovery_time: self.max_recovery_time,
        })
    }
}
