//! One way to run a blocking call from async code.

use crate::{Error, Phase, Result};

/// Runs `f` on tokio's blocking pool (librdkafka's blocking transactional calls, synchronous file I/O, a
/// consumer poll) and waits for it.
///
/// # Errors
/// [`Bug`](crate::ErrorKind::Bug) in `phase`, naming `what`, when `f` panicked (the panic is the error's source):
/// the caller stops with an error it can report instead of unwinding through the driver.
#[allow(clippy::disallowed_methods)] // the one place that may call spawn_blocking
pub async fn blocking<T: Send + 'static>(
    phase: Phase,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::bug(phase, format!("{what} panicked")).with_source(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panic_is_a_bug_error_naming_the_call() {
        assert_eq!(
            blocking(Phase::Commit, "adding", || 2 + 2).await.unwrap(),
            4
        );
        let err = blocking(Phase::Commit, "the flush", || -> u32 { panic!("boom") })
            .await
            .unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::Bug);
        assert!(err.to_string().contains("the flush panicked"), "{err}");
    }
}
