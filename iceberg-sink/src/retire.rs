//! Files a commit retired: the manifest lists of the snapshots it expired ([`TableTarget::with_snapshot_expiry`]),
//! the manifests merges replaced that no retained snapshot names any more ([`crate::manifest_merge`]), and the old
//! metadata files it pushed out of the table's metadata log (when the table asks for it with Iceberg's standard
//! property). iceberg-rust 0.10 deletes none of them itself.
//!
//! # Crash safety
//! Only files the committed metadata no longer references are deleted, and only after the catalog accepted the
//! commit: a reader of the current metadata never meets a missing file. A commit whose outcome is unknown deletes
//! nothing. A process killed between the commit and the deletions (drill step `after-expiring-commit`) or
//! during them (`while-retiring`) leaves the rest as orphans no snapshot references, which the orphan sweep
//! deletes once they are old enough, when it is on (`sweep_orphans_after`, [`crate::orphan_sweep`]). The deletions are bounded
//! by the sink's `commit_timeout`; what a hung storage did not delete stays an orphan too.
//!
//! # Drill
//! `RATCHET_ICEBERG_KILL_AT=<step>` makes the process kill itself with SIGKILL at that step of the first commit
//! that expired snapshots: `after-expiring-commit` (committed, nothing deleted) or `while-retiring` (one file
//! deleted). Manifest merging adds `after-merging` (merged manifests and list written, nothing committed), row
//! deltas `after-row-delta` (delete manifest and list written, nothing committed), compaction `after-compacting`
//! (a pre-commit's rewritten files written, nothing recorded) and `after-replacing` (the rewritten manifests and
//! list written, nothing committed), and all three `after-own-commit` (a commit with merged manifests, delete files
//! or a compaction landed, nothing deleted). For tests of crash safety; never set it
//! in production.
//!
//! [`TableTarget::with_snapshot_expiry`]: crate::commit::TableTarget::with_snapshot_expiry

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use iceberg::spec::{ManifestList, Snapshot};
use iceberg::table::Table;

/// The table property (Iceberg's standard one, as Java and Spark honour it) that asks a committer to delete the
/// metadata files its commit pushed out of the metadata log (`write.metadata.previous-versions-max` long).
pub const DELETE_METADATA_AFTER_COMMIT: &str = "write.metadata.delete-after-commit.enabled";

/// The drill's variable (see the module docs).
pub const KILL_VARIABLE: &str = "RATCHET_ICEBERG_KILL_AT";

/// After a commit that turned `base` into `committed`, deletes what it retired: the manifest list of every
/// snapshot of `base` that `committed` no longer has (a manifest list belongs to one snapshot, so nothing else
/// reads it), and, when the table sets [`DELETE_METADATA_AFTER_COMMIT`], the metadata files that were in `base`'s
/// log (or were `base` itself) and no longer are. At one commit per second both grow by gigabytes per day
/// (`docs/benchmarks.md`). Best effort: a file that cannot be deleted is only an orphan (no reader sees it), so
/// the failure is logged as a warning and the commit stands.
///
/// With `lists` (a table whose manifests are merged), also the manifests the expired snapshots' lists name that no
/// snapshot `committed` keeps names: merges replaced them, and only the expired snapshots still read them.
pub(crate) async fn delete_retired_files(
    base: &Table,
    committed: &Table,
    lists: Option<&ManifestListCache>,
) {
    let mut retired = expired_manifest_lists(base, committed);
    let expired = !retired.is_empty();
    if expired && let Some(lists) = lists {
        match replaced_manifests(base, committed, lists).await {
            Ok(manifests) => retired.extend(manifests),
            Err(e) => tracing::warn!(
                table = %committed.identifier(),
                error = %e,
                "cannot tell which manifests the expired snapshots alone named; they stay as orphans"
            ),
        }
    }
    let delete_metadata = committed
        .metadata()
        .properties()
        .get(DELETE_METADATA_AFTER_COMMIT)
        .is_some_and(|v| v.eq_ignore_ascii_case("true"));
    if delete_metadata {
        retired.extend(retired_metadata_files(base, committed));
    }
    if expired {
        drill("after-expiring-commit");
    }
    for (n, file) in retired.iter().enumerate() {
        if let Err(e) = committed.file_io().delete(file).await {
            tracing::warn!(
                table = %committed.identifier(),
                file = %file,
                error = %e,
                "cannot delete a file the commit retired; it stays as an orphan (no reader uses it)"
            );
        }
        if expired && n == 0 {
            drill("while-retiring");
        }
    }
}

/// The manifest lists of the snapshots `base` has and `committed` does not.
fn expired_manifest_lists(base: &Table, committed: &Table) -> BTreeSet<String> {
    let kept: HashSet<i64> = committed
        .metadata()
        .snapshots()
        .map(|s| s.snapshot_id())
        .collect();
    base.metadata()
        .snapshots()
        .filter(|s| !kept.contains(&s.snapshot_id()))
        .map(|s| s.manifest_list().to_string())
        .collect()
}

/// What each retained snapshot's manifest list names, read once per list (a list never changes).
#[derive(Debug, Default)]
pub(crate) struct ManifestListCache {
    manifests: Mutex<HashMap<String, Arc<HashSet<String>>>>,
}

impl ManifestListCache {
    /// The manifests `snapshot`'s list names.
    async fn manifests(
        &self,
        table: &Table,
        snapshot: &Snapshot,
    ) -> iceberg::Result<Arc<HashSet<String>>> {
        let path = snapshot.manifest_list();
        if let Some(known) = self.manifests.lock().expect("lists lock").get(path) {
            return Ok(known.clone());
        }
        let bytes = table.file_io().new_input(path)?.read().await?;
        let named: HashSet<String> =
            ManifestList::parse_with_version(&bytes, table.metadata().format_version())?
                .entries()
                .iter()
                .map(|m| m.manifest_path.clone())
                .collect();
        let named = Arc::new(named);
        self.manifests
            .lock()
            .expect("lists lock")
            .insert(path.to_string(), named.clone());
        Ok(named)
    }

    /// Forgets every list but those of `table`'s snapshots.
    fn keep_only(&self, table: &Table) {
        let kept: HashSet<&str> = table
            .metadata()
            .snapshots()
            .map(|s| s.manifest_list())
            .collect();
        self.manifests
            .lock()
            .expect("lists lock")
            .retain(|path, _| kept.contains(path.as_str()));
    }
}

/// The manifests named by the lists of the snapshots `base` has and `committed` does not, and by no list of a
/// snapshot `committed` has.
async fn replaced_manifests(
    base: &Table,
    committed: &Table,
    lists: &ManifestListCache,
) -> iceberg::Result<BTreeSet<String>> {
    let kept: HashSet<i64> = committed
        .metadata()
        .snapshots()
        .map(|s| s.snapshot_id())
        .collect();
    let mut candidates = BTreeSet::new();
    for snapshot in base
        .metadata()
        .snapshots()
        .filter(|s| !kept.contains(&s.snapshot_id()))
    {
        candidates.extend(lists.manifests(base, snapshot).await?.iter().cloned());
    }
    for snapshot in committed.metadata().snapshots() {
        let named = lists.manifests(committed, snapshot).await?;
        candidates.retain(|m| !named.contains(m));
    }
    lists.keep_only(committed);
    Ok(candidates)
}

/// The metadata files in `base`'s log (or `base` itself) that are not in `committed`'s.
fn retired_metadata_files(base: &Table, committed: &Table) -> BTreeSet<String> {
    let files = |table: &Table| -> HashSet<String> {
        table
            .metadata()
            .metadata_log()
            .iter()
            .map(|entry| entry.metadata_file.clone())
            .chain(table.metadata_location().map(str::to_string))
            .collect()
    };
    let kept = files(committed);
    files(base).difference(&kept).cloned().collect()
}

/// Kills this process with SIGKILL when [`KILL_VARIABLE`] names `step`.
#[allow(clippy::disallowed_methods)] // a crash drill reads its switch where it is checked
pub(crate) fn drill(step: &str) {
    if std::env::var(KILL_VARIABLE).is_ok_and(|at| at == step) {
        tracing::warn!(
            step,
            "Iceberg drill: this process kills itself with SIGKILL"
        );
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    }
}
