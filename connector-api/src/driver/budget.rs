//! Timeout budgeting: refuse to start when a pre-committed transaction could expire before a restarted job
//! commits it.

use std::time::Duration;

use crate::{Error, ErrorKind, Phase, Result, SinkId};

/// Checks `checkpoint_interval + max_restart_time` against a sink's external transaction timeout.
pub(super) fn check(
    sink: &SinkId,
    timeout: Option<Duration>,
    checkpoint_interval: Duration,
    max_restart_time: Duration,
) -> Result<()> {
    let Some(timeout) = timeout else {
        return Ok(());
    };
    let needed = checkpoint_interval + max_restart_time;
    if needed <= timeout {
        return Ok(());
    }
    Err(Error::new(
        ErrorKind::Config,
        Phase::Setup,
        format!(
            "the sink's transaction timeout ({timeout:?}) is shorter than checkpoint_interval ({checkpoint_interval:?}) \
             + max_restart_time ({max_restart_time:?}) = {needed:?}: a transaction pre-committed just before a crash \
             would be aborted by the external system before the restarted job could commit it, losing its records. \
             Raise the sink's transaction timeout (for Kafka: transaction_timeout, at most the broker's \
             transaction.max.timeout.ms), or lower checkpoint_interval or max_restart_time"
        ),
    )
    .with_sink(sink))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_a_budget_the_transaction_timeout_cannot_cover() {
        let sink = SinkId::new("kafka").unwrap();
        let secs = Duration::from_secs;
        assert!(check(&sink, None, secs(60), secs(600)).is_ok());
        assert!(check(&sink, Some(secs(900)), secs(60), secs(600)).is_ok());
        let err = check(&sink, Some(secs(60)), secs(30), secs(60)).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config);
        let message = err.to_string();
        assert!(
            message.contains("sink kafka") && message.contains("max_restart_time"),
            "{message}"
        );
    }
}
