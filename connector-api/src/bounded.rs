//! One way to bound an async call in time.

use crate::{Error, ErrorKind, Phase, Result};
use std::future::Future;
use std::time::Duration;

/// Runs `call` within `limit`: a server that hangs instead of answering is reported, never waited on.
///
/// Past `limit` the call is dropped where it stands, like a crash at that point: whatever it already sent may or
/// may not take effect, so the caller's protocol must treat the outcome as unknown (a commit is retried or
/// resolved at recovery, never assumed lost).
///
/// # Errors
/// `call`'s own error; when it took longer than `limit`, an error of `kind` in `phase` with the message
/// `timed_out` writes (name the call, the bound and what to check or raise).
pub async fn bounded<T>(
    limit: Duration,
    (kind, phase): (ErrorKind, Phase),
    timed_out: impl FnOnce() -> String,
    call: impl Future<Output = Result<T>>,
) -> Result<T> {
    tokio::time::timeout(limit, call)
        .await
        .unwrap_or_else(|_| Err(Error::new(kind, phase, timed_out())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_call_past_its_limit_is_dropped_and_reported_with_the_callers_message() {
        let answered = bounded(
            Duration::from_secs(1),
            (ErrorKind::Retryable, Phase::Commit),
            || unreachable!("answered in time"),
            async { Ok(7) },
        )
        .await
        .unwrap();
        assert_eq!(answered, 7);
        let hung = bounded(
            Duration::from_millis(20),
            (ErrorKind::Retryable, Phase::Commit),
            || "the catalog did not answer the commit within 20ms".to_string(),
            std::future::pending::<Result<()>>(),
        )
        .await
        .unwrap_err();
        assert_eq!(hung.kind(), ErrorKind::Retryable);
        assert!(
            hung.to_string()
                .contains("did not answer the commit within 20ms"),
            "{hung}"
        );
    }
}
