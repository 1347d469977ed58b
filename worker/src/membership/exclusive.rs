//! Holding a whole job for an operation that changes its layout or its decided work (`resolve`, `rescale`,
//! `forget-topic`, a `run` that rescales): the local lock, or every lease plus a presence row on the PostgreSQL
//! store, after waiting out (or refusing, naming them) the job's other live processes in every membership mode.

use anyhow::{Result, bail};

use super::presence::Presence;

/// The operations that hold a whole job, as their presence rows name their mode.
pub const OPERATIONS: [&str; 3] = ["resolve", "rescale", "forget-topic"];
use super::{Membership, leases, local};
use crate::config::{JobConfig, StoreConfig};

/// Runs `work` while holding `job` the way a worker does (the local lock, or the leases of all `subtasks`,
/// renewed every lease / 5 for as long as it takes, so a worker starting meanwhile waits for them), refusing when
/// another process of the job is still alive after a lease and a renewal (a process killed just before counts as
/// alive until its lease expires); `what` names this process in the lease table.
///
/// # Errors
/// Another process of the job is alive (named), the store cannot be reached, or what `work` reports.
pub async fn holding_every_subtask<T, F, Fut>(
    job: &JobConfig,
    subtasks: u32,
    what: &str,
    work: F,
) -> Result<T>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let mut presence = None;
    let leases: Box<dyn Membership> = match &job.store {
        StoreConfig::Local { path } => {
            Box::new(local::LocalLease::take(path, &job.job.name, subtasks)?)
        }
        StoreConfig::Postgres { url } => {
            let process = format!("{what}-{}", std::process::id());
            let leases = leases::PgLeases::join(
                url,
                &job.job.name,
                process.clone(),
                subtasks,
                job.job.lease,
            )
            .await?;
            let joined = Presence::join(url, &job.job.name, process, what, job.job.lease).await?;
            // A process killed a moment ago stays alive until its presence expires: wait that long, no longer.
            // Every mode's processes are there (leases, static members, the Kafka group, another operation).
            let patience = job.job.lease + job.job.lease / 5;
            let waited = std::time::Instant::now();
            loop {
                let running = joined.others().await?;
                if running.is_empty() {
                    break;
                }
                if waited.elapsed() >= patience {
                    let _ = leases.leave().await;
                    let _ = joined.leave().await;
                    bail!(
                        "job {:?} is running in {} process(es): {}, still alive after {patience:?}: stop every \
                         process of the job first to {what} it (whatever its membership: leases, static members, \
                         the Kafka group)",
                        job.job.name,
                        running.len(),
                        running.join(", ")
                    );
                }
                tracing::info!(processes = ?running,
                    "waiting for the job's other processes to stop or their presence to expire");
                tokio::time::sleep(job.job.lease / 5).await;
            }
            presence = Some(joined);
            Box::new(leases)
        }
    };
    // The only member's quota is every subtask.
    leases.renew().await?;
    let renewing = async {
        let mut tick = tokio::time::interval(job.job.lease / 5);
        tick.tick().await;
        loop {
            tick.tick().await;
            if let Err(e) = leases.renew().await {
                tracing::warn!(error = %format!("{e:#}"),
                    "cannot renew the leases; a worker may start once they expire (its claim then waits for this \
                     process's recovery guard, and a rescale's switch fails if it claimed a subtask)");
            }
            if let Some(presence) = &presence
                && let Err(e) = presence.renew().await
            {
                tracing::warn!(error = %format!("{e:#}"), "cannot renew this operation's presence");
            }
        }
    };
    let outcome = tokio::select! {
        outcome = work() => outcome,
        never = renewing => never,
    };
    if let Err(e) = leases.leave().await {
        tracing::warn!(error = %format!("{e:#}"), "cannot leave the job; its lease rows expire by themselves");
    }
    if let Some(presence) = &presence
        && let Err(e) = presence.leave().await
    {
        tracing::warn!(error = %format!("{e:#}"), "cannot delete this operation's presence; it expires by itself");
    }
    outcome
}
