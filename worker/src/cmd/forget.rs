//! `ratchet forget-topic --topic T`: retires a topic the job no longer reads. A topic dropped from the selection
//! keeps its positions in every checkpoint record (so its decided work is always committed, and its routed sink
//! instances are built for that), which keeps those instances alive for ever: a routed table dropped since stops
//! the job, and a topic recreated under the same name is refused as another topic.
//!
//! With every process of the job stopped (refused otherwise, as `resolve` is), for each subtask of the current
//! layout:
//!
//! 1. **Resolve** it (claim, recover: every decided checkpoint committed in every sink, the topic's routed
//!    instances included, everything else aborted);
//! 2. **Save** a record without the topic's positions, above every checkpoint id the subtask used, under a new
//!    claim (which fences anything older).
//!
//! A crash between subtasks leaves some subtasks with the topic and some without; running the command again
//! finishes it (a subtask already without the topic is left as it is). Afterwards no instance is built for the
//! topic, and a topic created under its name is read as new, from its beginning. What the routed instances keep
//! in their external systems (a table, a directory, transactional ids) stays: drop it by hand if unwanted, after
//! this command (step 1 needs it to commit the topic's decided work).

use std::collections::BTreeMap;

use anyhow::{Context, Result, bail};
use connector_api::{CheckpointRecord, SubtaskId};

use crate::cli::ForgetTopicArgs;
use crate::config::JobConfig;
use crate::jobstore::subtask_store::SubtaskStore;

/// `ratchet forget-topic`.
///
/// # Errors
/// The topic is still selected, the job has never run, another process of the job is alive, or a subtask cannot
/// be resolved or saved: each named; subtasks done before stay done (run the command again).
pub async fn command(args: ForgetTopicArgs) -> Result<()> {
    let job = JobConfig::load(&args.config)?;
    let topic = args.topic;
    if job.selection()?.selects(&topic) {
        bail!(
            "[source] still selects topic {topic:?}: remove it from the job file's selection first (the job would \
             read it again from its beginning)"
        );
    }
    crate::membership::exclusive::holding_every_subtask(
        &job,
        job.job.subtasks,
        "forget-topic",
        || forget_held(&job, &topic),
    )
    .await
}

async fn forget_held(job: &JobConfig, topic: &str) -> Result<()> {
    let name = &job.job.name;
    let jobs = crate::jobstore::open(&job.store, name);
    let Some(recorded) = jobs.record(job.job.subtasks, false).await? else {
        bail!("job {name:?} has never run: there is no position to forget");
    };
    if recorded.subtasks != job.job.subtasks {
        bail!(
            "the store records {} subtask(s) and the job file says {}: rescale first (`ratchet rescale --to {}`), \
             or set subtasks back",
            recorded.subtasks,
            job.job.subtasks,
            job.job.subtasks
        );
    }
    let job_id = recorded.job_id(name)?;
    let shaping = crate::job::shaping::Shaping::resolve(job).await?;
    let mut forgotten = 0;
    for subtask in 0..recorded.subtasks {
        let (restored, above) = crate::job::assemble::resolve_subtask(
            job,
            &jobs,
            job_id.as_ref(),
            subtask,
            recorded.generation,
            &shaping,
        )
        .await?;
        let (kept, dropped): (Vec<_>, Vec<_>) = restored
            .positions
            .into_iter()
            .partition(|p| p.topic != topic);
        if dropped.is_empty() {
            crate::ops::drill::forget_reached(subtask);
            continue;
        }
        forgotten += dropped.len();
        let store = SubtaskStore::open(
            &jobs,
            recorded.generation,
            SubtaskId(subtask),
            job.store_limits(),
        )
        .await?;
        let record = CheckpointRecord {
            id: above,
            positions: kept,
            committables: BTreeMap::new(),
        };
        store
            .save_under_new_claim(&record)
            .await
            .with_context(|| format!("saving subtask {subtask} without topic {topic:?}"))?;
        println!(
            "subtask {subtask}: {} position(s) of topic {topic:?} forgotten (its decided work committed first)",
            dropped.len()
        );
        crate::ops::drill::forget_reached(subtask);
    }
    if forgotten == 0 {
        println!("job {name:?} holds no position of topic {topic:?}: nothing to forget");
    } else {
        println!(
            "job {name:?} forgot topic {topic:?}: no sink instance is built for it any more, and a topic created \
             under its name is read as new"
        );
    }
    Ok(())
}
