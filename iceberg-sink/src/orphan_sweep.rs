//! The orphan sweep (`sweep_orphans_after`): deleting the files under a table's `data/` and `metadata/` that
//! nothing in the table references, left by commits that never landed (a killed writer's data files, manifests
//! and manifest lists; a lost swap's metadata file), Ratchet's or another engine's.
//!
//! # What is never deleted
//! - Anything the table references: the current metadata file and those in its metadata log, every retained
//!   snapshot's manifest list, the manifests it names and every data and delete file they list, statistics files.
//!   The directories are listed first and the table loaded after, so a commit that lands in between is seen.
//! - A file modified within the bound: a commit still in flight (Ratchet's own or another writer's) may name it
//!   when it lands. The bound is at least [`MIN_COMMIT_TIMEOUTS`] × `commit_timeout`, Ratchet's longest commit
//!   attempt with its retries, and should exceed every other writer's longest commit too.
//! - This job's and sink's data files (named `ratchet.<job>.<sink>.`): a decided checkpoint's files wait
//!   unreferenced until its commit or its recovery, which may be later than any bound (a subtask down for a day);
//!   each subtask's own recovery deletes the ones no checkpoint carries (`cleanup.rs`).
//!
//! Run by subtask 0 at recovery, after its restored checkpoints are committed.

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use connector_api::{Error, ErrorKind, Phase, Result};
use iceberg::table::Table;

use crate::cleanup::{list_files_modified, referenced_by_fresh_snapshots};
use crate::commit::TableTarget;
use crate::config::S3Settings;
use crate::error::iceberg_error;
use crate::ledger::SubtaskKey;
use crate::location::{canonical, data_location};

/// The shortest bound, in `commit_timeout`s: one commit attempt takes at most `commit_timeout`, and Ratchet's own
/// commit retries within it; three leave room for a commit that started just before the listing.
pub const MIN_COMMIT_TIMEOUTS: u32 = 3;

/// Checks that `after` (the `sweep_orphans_after` setting) is at least [`MIN_COMMIT_TIMEOUTS`] × `commit_timeout`.
///
/// # Errors
/// [`Config`](ErrorKind::Config) naming both settings.
pub(crate) fn check_bound(after: Duration, commit_timeout: Duration) -> Result<()> {
    let least = commit_timeout * MIN_COMMIT_TIMEOUTS;
    if after < least {
        return Err(Error::config(format!(
            "sweep_orphans_after = {after:?} is shorter than {MIN_COMMIT_TIMEOUTS} x commit_timeout ({least:?}): a \
             commit still in flight could name a file the sweep deletes; raise it (a day is usual when other \
             engines write the table)"
        )));
    }
    Ok(())
}

/// Deletes the files under `table`'s `data/` and `metadata/` that nothing references and that were last modified
/// more than `after` ago, but never `own`'s job's and sink's files (module docs). Returns the paths deleted.
///
/// # Errors
/// Retryable when the storage, the table or a manifest cannot be read (nothing is deleted before every retained
/// snapshot was read) or a file cannot be deleted.
pub async fn sweep_orphans(
    target: &TableTarget,
    own: &SubtaskKey,
    after: Duration,
    s3: &S3Settings,
) -> Result<Vec<String>> {
    let before = target.load(Phase::Recover).await?;
    let metadata_dir = format!(
        "{}/metadata/",
        before.metadata().location().trim_end_matches('/')
    );
    let data_dir = format!("{}/", data_location(before.metadata()));
    let mut listed = Vec::new();
    for dir in [data_dir, metadata_dir] {
        listed.extend(list_files_modified(&dir, "", s3).await?);
    }
    let mut table = target.load(Phase::Recover).await?;
    let cutoff = SystemTime::now() - after;
    let sink_prefix = format!("ratchet.{}.{}.", own.job, own.sink);
    let candidates: Vec<String> = listed
        .into_iter()
        .filter(|(_, modified)| modified.is_some_and(|m| m < cutoff))
        .map(|(path, _)| path)
        .filter(|path| {
            let name = path.rsplit('/').next().unwrap_or(path);
            !name.starts_with(&sink_prefix)
        })
        .collect();
    if candidates.is_empty() {
        return Ok(Vec::new());
    }
    let mut referenced = referenced_by_fresh_snapshots(target, &mut table).await?;
    referenced.extend(metadata_files(&table));
    let mut deleted = Vec::new();
    for path in candidates
        .into_iter()
        .filter(|p| !referenced.contains(&canonical(p)))
    {
        table.file_io().delete(&path).await.map_err(|e| {
            iceberg_error(Phase::Recover, format!("cannot delete orphan {path}"), e)
        })?;
        deleted.push(path);
    }
    if !deleted.is_empty() {
        tracing::info!(
            table = %table.identifier(),
            files = deleted.len(),
            older_than = ?after,
            "deleted orphan files nothing in the table references"
        );
    }
    Ok(deleted)
}

/// The metadata files `table` names beside its snapshots' manifests: the current metadata file, those in its
/// metadata log, and its (partition) statistics files, in [`canonical`] spelling.
fn metadata_files(table: &Table) -> HashSet<String> {
    let metadata = table.metadata();
    let mut files: HashSet<String> = metadata
        .metadata_log()
        .iter()
        .map(|log| canonical(&log.metadata_file))
        .collect();
    if let Some(current) = table.metadata_location() {
        files.insert(canonical(current));
    }
    files.extend(
        metadata
            .statistics_iter()
            .map(|s| canonical(&s.statistics_path)),
    );
    files.extend(
        metadata
            .partition_statistics_iter()
            .map(|s| canonical(&s.statistics_path)),
    );
    files
}

/// [`sweep_orphans`] within `bound`.
///
/// # Errors
/// [`Retryable`](ErrorKind::Retryable) when it takes longer (a storage that hangs); the sweep's own errors.
pub(crate) async fn sweep_within(
    bound: Duration,
    target: &TableTarget,
    own: &SubtaskKey,
    after: Duration,
    s3: &S3Settings,
) -> Result<Vec<String>> {
    match tokio::time::timeout(bound, sweep_orphans(target, own, after, s3)).await {
        Ok(swept) => swept,
        Err(_) => Err(Error::new(
            ErrorKind::Retryable,
            Phase::Recover,
            format!(
                "the orphan sweep of table {} took longer than {bound:?}: check the storage",
                target.table
            ),
        )),
    }
}
