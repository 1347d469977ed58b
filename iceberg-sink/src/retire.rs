//! Old metadata files a commit pushed out of the table's metadata log: deleted after the commit when the table asks
//! for it with Iceberg's standard property (iceberg-rust 0.10 never deletes them itself).

use std::collections::HashSet;

use iceberg::table::Table;

/// The table property (Iceberg's standard one, as Java and Spark honour it) that asks a committer to delete the
/// metadata files its commit pushed out of the metadata log (`write.metadata.previous-versions-max` long).
pub const DELETE_METADATA_AFTER_COMMIT: &str = "write.metadata.delete-after-commit.enabled";

/// After a commit that turned `base` into `committed`: when the table sets [`DELETE_METADATA_AFTER_COMMIT`],
/// deletes the metadata files that were in `base`'s log (or were `base` itself) and no longer are. iceberg-rust
/// 0.10 never deletes old metadata files itself; at one commit per second they grow by gigabytes per hour
/// (`docs/benchmarks.md`). Best effort: a file that cannot be deleted is only an orphan (no reader sees it), so
/// the failure is logged as a warning and the commit stands.
pub(crate) async fn delete_retired_metadata(base: &Table, committed: &Table) {
    let enabled = committed
        .metadata()
        .properties()
        .get(DELETE_METADATA_AFTER_COMMIT)
        .is_some_and(|v| v.eq_ignore_ascii_case("true"));
    if !enabled {
        return;
    }
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
    for retired in files(base).difference(&kept) {
        if let Err(e) = committed.file_io().delete(retired).await {
            tracing::warn!(
                table = %committed.identifier(),
                file = %retired,
                error = %e,
                "cannot delete a metadata file the commit retired; it stays as an orphan (no reader uses it)"
            );
        }
    }
}
