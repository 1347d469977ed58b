//! Deleting data files that a subtask wrote and no snapshot references: what aborted, failed or fenced attempts
//! left behind (never visible, but they cost storage).
//!
//! A file is a candidate only when its name is one of the subtask's own ([`SubtaskKey::file_stamp`]: its prefix,
//! then `e<epoch>.c<checkpoint>-`) and carries an owner epoch at or below the caller's claim: a newer instance's
//! files (a higher epoch) are never touched, whatever an older instance's cleanup finds. The data directory is
//! listed first and the table loaded after, so a file committed in between is seen as referenced; a candidate is
//! kept when any manifest of any snapshot the table retains lists it as live (added or existing: a compaction or a
//! manifest rewrite may reference this sink's files from snapshots that are not its own); a file listed only as
//! deleted is read by no retained snapshot (a compaction's input once the snapshots before it expired). Locations are compared
//! in one spelling ([`canonical`]): a manifest may say `wh//ns/t/...` where storage lists `wh/ns/t/...`. Deleting
//! runs only while the table still shows the caller's epoch for the subtask.

use std::collections::HashSet;

use connector_api::{Error, ErrorKind, Phase, Result};
use futures::TryStreamExt;
use iceberg::table::Table;
use opendal::Operator;

use crate::commit::TableTarget;
use crate::config::S3Settings;
use crate::error::iceberg_error;
use crate::ledger::SubtaskKey;
use crate::location::{canonical, data_location};

/// `key`'s data files that no manifest of any retained snapshot lists, written under an owner epoch at most
/// `epoch` (`None`: the epoch the table records for the subtask), with the table as loaded after the listing.
/// Read-only.
///
/// # Errors
/// Retryable when the storage, the table or a manifest cannot be read.
pub async fn unreferenced_files(
    target: &TableTarget,
    key: &SubtaskKey,
    epoch: Option<u64>,
    s3: &S3Settings,
) -> Result<(Table, Vec<String>)> {
    let before = target.load(Phase::Recover).await?;
    let data_dir = format!("{}/", data_location(before.metadata()));
    let listed = list_files(&data_dir, &key.file_prefix(), s3).await?;
    // Loaded after the listing: whatever was committed before a file was listed is in this table's manifests.
    let mut table = target.load(Phase::Recover).await?;
    let bound = epoch.unwrap_or_else(|| key.state(&table.metadata_ref()).epoch);
    let candidates: Vec<String> = listed
        .into_iter()
        .filter(|path| key.file_stamp(path).is_some_and(|(e, _)| e <= bound))
        .collect();
    if candidates.is_empty() {
        return Ok((table, Vec::new()));
    }
    let referenced = referenced_by_fresh_snapshots(target, &mut table).await?;
    let unreferenced = candidates
        .into_iter()
        .filter(|p| !referenced.contains(&canonical(p)))
        .collect();
    Ok((table, unreferenced))
}

/// Deletes `key`'s unreferenced data files ([`unreferenced_files`] up to `epoch`, this instance's claim); returns
/// the paths deleted.
///
/// # Errors
/// [`Fenced`](ErrorKind::Fenced) (nothing deleted) when the table shows a newer epoch for the subtask: another
/// instance recovered it and owns its files now. Retryable when the storage or a manifest cannot be read (nothing
/// is deleted before every snapshot was read).
pub async fn delete_unreferenced_files(
    target: &TableTarget,
    key: &SubtaskKey,
    epoch: u64,
    s3: &S3Settings,
) -> Result<Vec<String>> {
    let (table, unreferenced) = unreferenced_files(target, key, Some(epoch), s3).await?;
    let owner = key.state(&table.metadata_ref()).epoch;
    if owner != epoch {
        return Err(Error::new(
            ErrorKind::Fenced,
            Phase::Recover,
            format!(
                "table {} shows owner epoch {owner} for this subtask, this instance holds {epoch}: another \
                 instance recovered it; its files are left alone",
                table.identifier()
            ),
        ));
    }
    let mut deleted = Vec::new();
    for path in unreferenced {
        table
            .file_io()
            .delete(&path)
            .await
            .map_err(|e| iceberg_error(Phase::Recover, format!("cannot delete {path}"), e))?;
        deleted.push(path);
    }
    if !deleted.is_empty() {
        tracing::info!(
            table = %table.identifier(),
            sink = %key.sink,
            subtask = %key.subtask,
            files = deleted.len(),
            "deleted data files no snapshot references (left by aborted attempts)"
        );
    }
    Ok(deleted)
}

/// [`referenced_files`] of `table`; when a manifest list or manifest cannot be read and the table has moved since
/// (another writer's commit expired the snapshot naming it and deleted the file: merges make that common at 1 s
/// commits), again on the fresh table, which `table` becomes, up to three times.
pub(crate) async fn referenced_by_fresh_snapshots(
    target: &TableTarget,
    table: &mut Table,
) -> Result<HashSet<String>> {
    let mut attempt = 0;
    loop {
        match referenced_files(table).await {
            Ok(referenced) => return Ok(referenced),
            Err(e) if attempt < 2 => {
                let fresh = target.load(Phase::Recover).await?;
                if fresh.metadata_location() == table.metadata_location() {
                    return Err(unreadable(table, e));
                }
                *table = fresh;
                attempt += 1;
            }
            Err(e) => return Err(unreadable(table, e)),
        }
    }
}

/// A retained snapshot's manifest list or manifest that could not be read while establishing what the table
/// references: nothing is deleted on such a partial view. Retryable: the usual cause is another writer's expiry
/// deleting the files of the snapshots it expired while this read them (seen beside Spark's maintenance loop),
/// which the next attempt, on fresh metadata, does not meet; a table that really lacks a file keeps failing here,
/// naming it.
fn unreadable(table: &Table, e: Error) -> Error {
    Error::new(
        ErrorKind::Retryable,
        Phase::Recover,
        format!(
            "cannot establish which files table {} references (a manifest list or manifest of a retained snapshot \
             could not be read; another writer may be expiring snapshots): nothing was deleted; retrying",
            table.identifier()
        ),
    )
    .with_source(e)
}

/// Every file path the retained snapshots reference, in [`canonical`] spelling: their manifest lists, the
/// manifests those name, and every data and delete file the manifests list as live (added or existing). A file
/// listed only as deleted is read by no retained snapshot (one that reads it lists it as live): a compaction's
/// input once the snapshots before the compaction expired.
async fn referenced_files(table: &Table) -> Result<HashSet<String>> {
    let metadata = table.metadata_ref();
    let read_error = |e| iceberg_error(Phase::Recover, "cannot read the table's manifests", e);
    let mut manifests = HashSet::new();
    let mut files = HashSet::new();
    for snapshot in metadata.snapshots() {
        files.insert(canonical(snapshot.manifest_list()));
        let list = table
            .manifest_list_reader(snapshot)
            .load()
            .await
            .map_err(read_error)?;
        for manifest in list.entries() {
            if !manifests.insert(manifest.manifest_path.clone()) {
                continue;
            }
            files.insert(canonical(&manifest.manifest_path));
            let manifest = manifest
                .load_manifest(table.file_io())
                .await
                .map_err(read_error)?;
            files.extend(
                manifest
                    .entries()
                    .iter()
                    .filter(|entry| entry.is_alive())
                    .map(|entry| canonical(entry.data_file().file_path())),
            );
        }
    }
    Ok(files)
}

/// Full paths (with scheme) of the files under `dir` (recursively) whose name starts with `prefix`.
async fn list_files(dir: &str, prefix: &str, s3: &S3Settings) -> Result<Vec<String>> {
    Ok(list_files_modified(dir, prefix, s3)
        .await?
        .into_iter()
        .map(|(path, _)| path)
        .collect())
}

/// [`list_files`] with each file's last modification time, when the storage reports one.
pub(crate) async fn list_files_modified(
    dir: &str,
    prefix: &str,
    s3: &S3Settings,
) -> Result<Vec<(String, Option<std::time::SystemTime>)>> {
    let (operator, root, scheme_root) = operator_for(dir, s3)?;
    let listed = operator
        .lister_with(&root)
        .recursive(true)
        .await
        .map_err(|e| storage_error(dir, e))?;
    let entries: Vec<opendal::Entry> = listed
        .try_collect()
        .await
        .map_err(|e| storage_error(dir, e))?;
    Ok(entries
        .into_iter()
        .filter(|entry| entry.metadata().is_file())
        .filter(|entry| entry.name().starts_with(prefix))
        .map(|entry| {
            let modified = entry
                .metadata()
                .last_modified()
                .map(std::time::SystemTime::from);
            (format!("{scheme_root}{}", entry.path()), modified)
        })
        .collect())
}

/// An operator for `dir` (`file:///...` or `s3://bucket/...`): (operator, path of `dir` inside it, what to put
/// before a listed path to get the full location back).
fn operator_for(dir: &str, s3: &S3Settings) -> Result<(Operator, String, String)> {
    if let Some(path) = dir.strip_prefix("file://") {
        let operator = Operator::new(opendal::services::Fs::default().root("/"))
            .map_err(|e| storage_error(dir, e))?
            .finish();
        return Ok((
            operator,
            path.trim_start_matches('/').to_string(),
            "file:///".into(),
        ));
    }
    let (scheme, rest) = dir.split_once("://").ok_or_else(|| unsupported(dir))?;
    if !matches!(scheme, "s3" | "s3a" | "s3n") {
        return Err(unsupported(dir));
    }
    let (bucket, path) = rest.split_once('/').unwrap_or((rest, ""));
    let mut builder = opendal::services::S3::default().bucket(bucket).root("/");
    if let Some(endpoint) = &s3.endpoint {
        builder = builder.endpoint(endpoint);
    }
    builder = builder.region(s3.region.as_deref().unwrap_or("us-east-1"));
    if let Some(pair) = s3.credentials()? {
        builder = builder
            .access_key_id(&pair.access_key_id)
            .secret_access_key(pair.secret_access_key.expose());
    }
    if !s3.force_path_style {
        builder = builder.enable_virtual_host_style();
    }
    let operator = Operator::new(builder)
        .map_err(|e| storage_error(dir, e))?
        .finish();
    Ok((operator, path.to_string(), format!("{scheme}://{bucket}/")))
}

fn unsupported(dir: &str) -> Error {
    Error::new(
        ErrorKind::Config,
        Phase::Recover,
        format!(
            "cannot list {dir}: the Iceberg sink cleans up file:// and s3:// warehouses only (set cleanup_on_recover = false)"
        ),
    )
}

fn storage_error(dir: &str, e: opendal::Error) -> Error {
    Error::new(
        ErrorKind::Retryable,
        Phase::Recover,
        format!("cannot list the table's data files under {dir}"),
    )
    .with_source(e)
}
