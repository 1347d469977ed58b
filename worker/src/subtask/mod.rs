//! One subtask of a job, run by whichever process holds its lease: claim and recover it through the driver, read
//! its share of the partitions from the restored positions, write every batch to every sink, checkpoint every
//! `checkpoint_interval`, and stop when told, after a last checkpoint. (Stopping at once needs nothing here: the
//! process exits, and the next owner's recovery resolves what was in flight.)

mod outputs;
mod serve;

use std::collections::BTreeSet;
use std::future::Future;

use connector_api::{Error, ErrorKind, Result};
use tokio::sync::watch;

use crate::job::assemble::{SubtaskContext, build, instances_for_record, routed_topics_held};
use outputs::Outputs;
use serve::serve;

/// How a running subtask is asked to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// Keep running.
    No,
    /// Checkpoint what was written (commit it), then close: for a graceful shutdown and for handing the subtask
    /// to another process.
    Graceful,
}

/// How a subtask run ended without an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Stopped as asked.
    Stopped,
    /// Another process claimed the subtask (this one's saves were fenced): it is that process's now.
    TakenOver,
}

/// Runs subtask `index` until `stop` says so, another process takes it over (a claim or a sink fenced this one:
/// [`Ended::TakenOver`]), or an error. A topic that a routed sink has no instance for yet, read while running,
/// starts the subtask again with one ([`crate::job::routing`]), after a checkpoint of what was read before it.
///
/// # Errors
/// Whatever the store, a sink or the source reports; the driver has then stopped, and running the subtask again
/// recovers what the failure left.
pub async fn run(
    context: &SubtaskContext,
    index: u32,
    stop: watch::Receiver<Stop>,
) -> Result<Ended> {
    let mut new_topics = BTreeSet::new();
    loop {
        match run_until_stopped(context, index, stop.clone(), &new_topics).await {
            Ok(Served::Ended(ended)) => return Ok(ended),
            Ok(Served::NewTopic(topic)) => {
                tracing::info!(subtask = index, %topic,
                    "read a topic the routed sinks have no instance for yet: starting the subtask again with one");
                new_topics.insert(topic);
            }
            Err(e) if e.kind() == ErrorKind::Fenced => {
                tracing::warn!(subtask = index, error = %connector_api::Report(&e),
                    "another process took this subtask over; stopping it here");
                return Ok(Ended::TakenOver);
            }
            Err(e) => return Err(e),
        }
    }
}

/// How serving a subtask ended without an error.
enum Served {
    /// As [`Ended`] says.
    Ended(Ended),
    /// A batch of this topic came, and a routed sink has no instance for it: what was read before it is
    /// checkpointed, and the subtask must start again with the instance.
    NewTopic(String),
}

async fn run_until_stopped(
    context: &SubtaskContext,
    index: u32,
    mut stop: watch::Receiver<Stop>,
    new_topics: &BTreeSet<String>,
) -> Result<Served> {
    let topics = routed_topics_held(context, index, new_topics).await?;
    let (mut driver, prepared) = build(context, index, &topics).await?;
    // Claiming can wait for another process's recovery (or an orphaned claim, until the server ends it): a stop
    // asked meanwhile drops the attempt, which is safe at any point (the next owner's recovery resolves it).
    let restored = tokio::select! {
        restored = driver.start_adding(instances_for_record(context, index, &topics, &prepared)) => restored?,
        _ = stop.wait_for(|asked| *asked == Stop::Graceful) => {
            tracing::info!(subtask = index, "stopped while claiming or recovering the subtask");
            return Ok(Served::Ended(Ended::Stopped));
        }
    };
    tracing::info!(subtask = index, owner = restored.owner.0, resumed_after = ?restored.checkpoint,
        "subtask claimed and recovered");
    let outputs = Outputs::of_started(
        &driver,
        &context.job,
        index,
        topics,
        &restored,
        prepared.dead_letter,
    )?;
    match serve(context, index, &mut driver, &outputs, &restored, stop).await {
        Ok(served @ (Served::Ended(Ended::Stopped) | Served::NewTopic(_))) => {
            driver.close().await?;
            if matches!(served, Served::Ended(_)) {
                tracing::info!(subtask = index, "subtask stopped after its last checkpoint");
            }
            Ok(served)
        }
        Err(e) if e.kind() == ErrorKind::Fenced => {
            Err(fenced_or_expired(driver.taken_over(), e).await)
        }
        Err(e) => Err(taken_over_meanwhile(driver.taken_over(), e).await),
        outcome => outcome,
    }
}

/// A failure that is not a fence, checked against the store: when another process claimed the subtask
/// meanwhile, the failure is the take-over's doing (a sink's fence that surfaced as something else) and is
/// reported as [`Fenced`](ErrorKind::Fenced), so this process does not run the subtask again and fence the new
/// owner in turn. Otherwise, or when the store cannot answer, the failure as it was.
async fn taken_over_meanwhile(taken_over: impl Future<Output = Result<bool>>, e: Error) -> Error {
    match taken_over.await {
        Ok(true) => Error::new(
            ErrorKind::Fenced,
            e.phase(),
            "the subtask failed after another process claimed it: taken over",
        )
        .with_source(e),
        Ok(false) | Err(_) => e,
    }
}

/// A sink or the store reported this instance fenced: a take-over (the store's owner epoch is newer), returned
/// as it is; or, when the store says this process still owns the subtask, the sink's own transaction expired or
/// was fenced by something else (a Kafka transaction the broker aborted after `transaction_timeout`): a failure,
/// counted toward `max_restarts`, whose restart recovers it.
async fn fenced_or_expired(taken_over: impl Future<Output = Result<bool>>, e: Error) -> Error {
    match taken_over.await {
        Ok(false) => Error::new(
            ErrorKind::Fatal,
            e.phase(),
            "a sink reported this instance fenced, but the checkpoint store says this process still owns the \
             subtask: nobody took it over, so the sink's transaction expired or was fenced by something else \
             (for Kafka: the broker aborts a transaction open longer than transaction_timeout); restarting, and \
             recovery resolves what was decided",
        )
        .with_source(e),
        Ok(true) => e,
        Err(store) => {
            tracing::warn!(error = %connector_api::Report(&store),
                "cannot ask the checkpoint store who owns the subtask; treating the fence as a take-over");
            e
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use connector_api::Phase;

    fn fenced() -> Error {
        Error::new(
            ErrorKind::Fenced,
            Phase::Commit,
            "producer fenced: a newer epoch",
        )
    }

    #[tokio::test]
    async fn a_fence_is_a_take_over_only_when_the_store_names_another_owner() {
        let taken = fenced_or_expired(async { Ok(true) }, fenced()).await;
        assert_eq!(taken.kind(), ErrorKind::Fenced);

        // Still the owner: the sink's own transaction expired; a counted failure, restarted.
        let expired = fenced_or_expired(async { Ok(false) }, fenced()).await;
        assert_eq!(expired.kind(), ErrorKind::Fatal);
        assert_eq!(expired.phase(), Phase::Commit);
        let report = connector_api::Report(&expired).to_string();
        assert!(
            report.contains("still owns the subtask") && report.contains("producer fenced"),
            "{report}"
        );

        // Unknown: treated as a take-over (the store is what fences saves anyway).
        let unknown = fenced_or_expired(
            async {
                Err(Error::new(
                    ErrorKind::Retryable,
                    Phase::Checkpoint,
                    "store down",
                ))
            },
            fenced(),
        )
        .await;
        assert_eq!(unknown.kind(), ErrorKind::Fenced);
    }

    #[tokio::test]
    async fn any_failure_after_another_process_claimed_the_subtask_is_a_take_over() {
        let purged = || {
            Error::new(
                ErrorKind::MustAbort,
                Phase::PreCommit,
                "a record was not delivered: Purged in queue",
            )
        };
        let taken = taken_over_meanwhile(async { Ok(true) }, purged()).await;
        assert_eq!(taken.kind(), ErrorKind::Fenced);
        assert_eq!(taken.phase(), Phase::PreCommit);
        assert!(
            connector_api::Report(&taken)
                .to_string()
                .contains("Purged in queue")
        );

        let own = taken_over_meanwhile(async { Ok(false) }, purged()).await;
        assert_eq!(own.kind(), ErrorKind::MustAbort);
        let unknown = taken_over_meanwhile(
            async {
                Err(Error::new(
                    ErrorKind::Retryable,
                    Phase::Checkpoint,
                    "store down",
                ))
            },
            purged(),
        )
        .await;
        assert_eq!(unknown.kind(), ErrorKind::MustAbort);
    }
}
