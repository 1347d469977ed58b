//! Retrying steps whose error says so ([`Action::Retry`](crate::Action::Retry)): exponential backoff with jitter,
//! bounded in attempts and in total waiting time, from the `backon` crate. This is the only retry layer for the
//! protocol's steps: a sink's client calls are not retried again around it (the AWS SDK keeps its own standard
//! retries, configured, for single HTTP requests).

use std::future::Future;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

use crate::Result;

/// How retryable errors are retried. Errors whose [`action`](crate::action) is not `Retry` are never retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included (1 = no retry).
    pub max_attempts: u32,
    /// Wait before the second attempt; doubled after each failure, with jitter.
    pub initial_backoff: Duration,
    /// Upper bound of one wait.
    pub max_backoff: Duration,
    /// Upper bound of all waits together: retrying stops once the next wait would pass it.
    pub max_total_backoff: Duration,
}

impl Default for RetryPolicy {
    /// 8 attempts, 100 ms doubling to 10 s, at most 30 s of waiting in all.
    fn default() -> Self {
        Self {
            max_attempts: 8,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(10),
            max_total_backoff: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// No retries at all.
    pub const NEVER: RetryPolicy = RetryPolicy {
        max_attempts: 1,
        initial_backoff: Duration::ZERO,
        max_backoff: Duration::ZERO,
        max_total_backoff: Duration::ZERO,
    };

    fn backoff(&self) -> ExponentialBackoff {
        ExponentialBuilder::default()
            .with_min_delay(self.initial_backoff)
            .with_max_delay(self.max_backoff)
            .with_max_times(self.max_attempts.saturating_sub(1) as usize)
            .with_total_delay(Some(self.max_total_backoff))
            .with_jitter()
            .build()
    }

    /// Runs `attempt` until it succeeds, fails with an error that is not to be retried, or runs out of attempts
    /// or time (then the last error is returned). Each retry is logged with `what`.
    pub async fn run<T, F, Fut>(&self, what: &str, attempt: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        self.run_while(what, crate::Error::is_retryable, render, attempt)
            .await
    }

    /// Runs `attempt`, an idempotent call inside one protocol step, until it succeeds, fails with an error that is
    /// not [transient](crate::Error::is_transient), or runs out of attempts or time. Unlike [`run`](Self::run) it
    /// does not ask the driver's action table (which says, for instance, that a failed pre-commit is aborted and
    /// replayed, not retried): the caller knows the call may be repeated, and the step's own error handling
    /// applies to what finally comes out.
    pub async fn run_idempotent<T, F, Fut>(&self, what: &str, attempt: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        self.run_while(what, crate::Error::is_transient, render, attempt)
            .await
    }

    /// Runs `attempt`, a call outside the protocol's steps whose errors are not this crate's (the worker's
    /// start-up calls to its store, with `anyhow` errors), until it succeeds, fails with an error `transient`
    /// rejects, or runs out of attempts or time; the last error is returned. Each retry is logged with `what` and
    /// the error's chain (`{:#}`).
    pub async fn run_when<T, E, F, Fut>(
        &self,
        what: &str,
        transient: impl Fn(&E) -> bool,
        attempt: F,
    ) -> std::result::Result<T, E>
    where
        E: std::fmt::Display,
        F: FnMut() -> Fut,
        Fut: Future<Output = std::result::Result<T, E>>,
    {
        self.run_while(what, transient, |e: &E| format!("{e:#}"), attempt)
            .await
    }

    /// The loop behind the `run` methods: retries errors `retry` accepts while attempts and time are left,
    /// logging each with `render`.
    async fn run_while<T, E, F, Fut>(
        &self,
        what: &str,
        retry: impl Fn(&E) -> bool,
        render: impl Fn(&E) -> String,
        mut attempt: F,
    ) -> std::result::Result<T, E>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = std::result::Result<T, E>>,
    {
        let mut attempts = self.attempts();
        loop {
            match attempt().await {
                Err(e) if retry(&e) && attempts.wait(what, &render(&e)).await => {}
                outcome => return outcome,
            }
        }
    }

    /// The longest [`RetryPolicy::run`] can take when each attempt takes at most `attempt`: every attempt plus
    /// the waits between them (at most `max_total_backoff`).
    pub fn worst_case(&self, attempt: Duration) -> Duration {
        let mut waits = Duration::ZERO;
        let mut backoff = self.initial_backoff;
        for _ in 1..self.max_attempts {
            // Jitter adds up to one more backoff to each wait.
            waits += (backoff * 2).min(self.max_backoff * 2);
            backoff = (backoff * 2).min(self.max_backoff);
        }
        attempt * self.max_attempts + waits.min(self.max_total_backoff)
    }

    /// The attempt counter behind [`RetryPolicy::run`], for calls that borrow mutably and so cannot go through a
    /// closure:
    ///
    /// ```no_run
    /// # async fn demo(sink: &mut impl connector_api::TwoPhaseCommit) -> connector_api::Result<()> {
    /// let mut attempts = connector_api::RetryPolicy::default().attempts();
    /// loop {
    ///     match sink.begin(connector_api::CheckpointId(1)).await {
    ///         Err(e) if attempts.retry("begin", &e).await => {}
    ///         outcome => return outcome,
    ///     }
    /// }
    /// # }
    /// ```
    pub fn attempts(&self) -> Attempts {
        Attempts {
            backoff: self.backoff(),
            tries: 1,
        }
    }
}

/// This crate's error with its causes, for the retry log.
fn render(error: &crate::Error) -> String {
    crate::Report(error).to_string()
}

/// Attempts made so far under a [`RetryPolicy`].
#[derive(Debug)]
pub struct Attempts {
    backoff: ExponentialBackoff,
    tries: u32,
}

impl Attempts {
    /// Whether to try again after `error`: `true` (after sleeping the next backoff) when the error's action is
    /// [`Retry`](crate::Action::Retry) and attempts and time are left, `false` otherwise.
    pub async fn retry(&mut self, what: &str, error: &crate::Error) -> bool {
        error.is_retryable() && self.wait(what, &render(error)).await
    }

    /// Sleeps the next backoff after `error` (rendered) and returns `true`, or `false` when attempts or time are
    /// used up.
    async fn wait(&mut self, what: &str, error: &str) -> bool {
        let Some(wait) = self.backoff.next() else {
            return false;
        };
        tracing::warn!(what, attempt = self.tries, backoff = ?wait, error,
            "transient failure, retrying");
        tokio::time::sleep(wait).await;
        self.tries += 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;
    use crate::{Error, ErrorKind, Phase};

    fn quick(max_attempts: u32) -> RetryPolicy {
        RetryPolicy {
            max_attempts,
            initial_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(2),
            max_total_backoff: Duration::from_secs(1),
        }
    }

    #[tokio::test]
    async fn retries_transient_errors_until_success() {
        let calls = AtomicU32::new(0);
        let result = quick(5)
            .run("test", || async {
                if calls.fetch_add(1, Ordering::SeqCst) < 2 {
                    Err(Error::new(ErrorKind::Retryable, Phase::Commit, "flaky"))
                } else {
                    Ok(7)
                }
            })
            .await;
        assert_eq!(result.unwrap(), 7);
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn an_idempotent_call_is_retried_in_a_step_the_driver_does_not_retry() {
        let calls = AtomicU32::new(0);
        let flaky = || async {
            if calls.fetch_add(1, Ordering::SeqCst) < 2 {
                Err(Error::new(
                    ErrorKind::Retryable,
                    Phase::PreCommit,
                    "coordinator loading",
                ))
            } else {
                Ok(7)
            }
        };
        // The action table: a failed pre-commit is aborted and replayed, not retried.
        assert!(quick(5).run("test", flaky).await.is_err());
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        calls.store(0, Ordering::SeqCst);
        assert_eq!(quick(5).run_idempotent("test", flaky).await.unwrap(), 7);
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        // What is not transient is never repeated.
        calls.store(0, Ordering::SeqCst);
        let fenced = || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err::<(), _>(Error::new(ErrorKind::Fenced, Phase::PreCommit, "fenced"))
        };
        assert!(quick(5).run_idempotent("test", fenced).await.is_err());
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn worst_case_adds_every_attempt_and_the_bounded_waits() {
        let policy = RetryPolicy {
            max_attempts: 4,
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(3),
            max_total_backoff: Duration::from_secs(100),
        };
        // 4 attempts of 10 s; waits of at most 2 + 4 + 6 s with jitter.
        assert_eq!(
            policy.worst_case(Duration::from_secs(10)),
            Duration::from_secs(52)
        );
        let bounded = RetryPolicy {
            max_total_backoff: Duration::from_secs(5),
            ..policy
        };
        assert_eq!(
            bounded.worst_case(Duration::from_secs(10)),
            Duration::from_secs(45)
        );
    }

    #[tokio::test]
    async fn stops_once_the_total_backoff_is_spent() {
        let calls = AtomicU32::new(0);
        let policy = RetryPolicy {
            max_attempts: 100,
            initial_backoff: Duration::from_millis(20),
            max_backoff: Duration::from_millis(20),
            max_total_backoff: Duration::from_millis(100),
        };
        policy
            .run("test", || async {
                calls.fetch_add(1, Ordering::SeqCst);
                Err::<(), _>(Error::new(ErrorKind::Retryable, Phase::Commit, "down"))
            })
            .await
            .unwrap_err();
        let calls = calls.load(Ordering::SeqCst);
        assert!((2..=10).contains(&calls), "{calls} attempts");
    }

    #[tokio::test]
    async fn gives_up_after_max_attempts_and_never_retries_fatal_errors() {
        let calls = AtomicU32::new(0);
        let err = quick(3)
            .run("test", || async {
                calls.fetch_add(1, Ordering::SeqCst);
                Err::<(), _>(Error::new(ErrorKind::Retryable, Phase::Commit, "down"))
            })
            .await
            .unwrap_err();
        assert!(err.is_retryable());
        assert_eq!(calls.load(Ordering::SeqCst), 3);

        calls.store(0, Ordering::SeqCst);
        quick(3)
            .run("test", || async {
                calls.fetch_add(1, Ordering::SeqCst);
                Err::<(), _>(Error::new(ErrorKind::Fatal, Phase::Commit, "broken"))
            })
            .await
            .unwrap_err();
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }
}
