//! Retrying transient failures with exponential backoff.

use std::future::Future;
use std::time::Duration;

use crate::Result;

/// How transient ([`Retryable`](crate::ErrorKind::Retryable)) errors are retried. Other kinds are never retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included (1 = no retry).
    pub max_attempts: u32,
    /// Wait before the second attempt; doubled after each failure.
    pub initial_backoff: Duration,
    /// Upper bound of the wait.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    /// 8 attempts, 100 ms doubling to 10 s: about 30 s of trying in all.
    fn default() -> Self {
        Self {
            max_attempts: 8,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(10),
        }
    }
}

impl RetryPolicy {
    /// Runs `attempt` until it succeeds, fails with a non-retryable error, or runs out of attempts (then the last
    /// error is returned). Each retry is logged with `what`.
    pub async fn run<T, F, Fut>(&self, what: &str, mut attempt: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let mut attempts = self.attempts();
        loop {
            match attempt().await {
                Err(e) if attempts.retry(what, &e).await => {}
                outcome => return outcome,
            }
        }
    }

    /// The longest [`RetryPolicy::run`] can take when each attempt takes at most `attempt`: every attempt plus
    /// every backoff between them.
    pub fn worst_case(&self, attempt: Duration) -> Duration {
        let mut total = attempt * self.max_attempts;
        let mut backoff = self.initial_backoff;
        for _ in 1..self.max_attempts {
            total += backoff;
            backoff = (backoff * 2).min(self.max_backoff);
        }
        total
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
            policy: *self,
            tries: 1,
            backoff: self.initial_backoff,
        }
    }
}

/// Attempts made so far under a [`RetryPolicy`].
#[derive(Debug)]
pub struct Attempts {
    policy: RetryPolicy,
    tries: u32,
    backoff: Duration,
}

impl Attempts {
    /// Whether to try again after `error`: `true` (after sleeping the backoff) for a retryable error with
    /// attempts left, `false` otherwise.
    pub async fn retry(&mut self, what: &str, error: &crate::Error) -> bool {
        if !error.is_retryable() {
            return false;
        }
        let report = crate::Report(error).to_string();
        self.again(what, true, report).await
    }

    /// [`Attempts::retry`] for errors of other types: `transient` says whether the error is worth retrying,
    /// `error` (its description) is logged.
    pub async fn again(&mut self, what: &str, transient: bool, error: String) -> bool {
        if !transient || self.tries >= self.policy.max_attempts {
            return false;
        }
        tracing::warn!(what, attempt = self.tries, backoff = ?self.backoff, error = %error,
            "transient failure, retrying");
        tokio::time::sleep(self.backoff).await;
        self.backoff = (self.backoff * 2).min(self.policy.max_backoff);
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

    #[test]
    fn worst_case_adds_every_attempt_and_backoff() {
        let policy = RetryPolicy {
            max_attempts: 4,
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(3),
        };
        // 4 attempts of 10 s, backoffs 1 + 2 + 3.
        assert_eq!(
            policy.worst_case(Duration::from_secs(10)),
            Duration::from_secs(46)
        );
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
