//! `ratchet rescale --to N`: changes the subtask count of a job that is down ([`crate::job::rescale`] says how,
//! step by step, and what a crash at each step leaves).

use anyhow::Result;

use crate::config::JobConfig;

/// `ratchet rescale`: changes the subtask count of a job that is down.
///
/// # Errors
/// As [`crate::job::rescale::rescale`].
pub async fn command(args: crate::cli::RescaleArgs) -> Result<()> {
    let job = JobConfig::load(&args.config)?;
    crate::job::rescale::rescale(&job, args.to).await?;
    if job.job.subtasks != args.to {
        println!(
            "the job file still says subtasks = {}: set it to {} before the next `ratchet run`",
            job.job.subtasks, args.to
        );
    }
    Ok(())
}
