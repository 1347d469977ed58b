//! Deterministic file names: everything a file's name says is derived from the sink's scope (job and sink), subtask, checkpoint, the
//! writing instance's owner epoch and a sequence number, so recovery can tell which files a sink instance owns, a
//! retried commit reproduces the same name, and a zombie (an older epoch) never writes to a path the current
//! instance uses.

use connector_api::{CheckpointId, SinkScope, SubtaskId};

/// The name of one output file, and of its hidden in-progress and pending stages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileName {
    /// The scope of the sink that owns the file (`<job>~<sink>`, or the sink id: [`SinkScope`]).
    pub scope: SinkScope,
    /// The subtask that wrote it.
    pub subtask: SubtaskId,
    /// The checkpoint whose transaction it belongs to.
    pub checkpoint: CheckpointId,
    /// The owner epoch of the instance that wrote it (see the crate docs on fencing).
    pub epoch: u64,
    /// Position among the files of that checkpoint (and partition).
    pub seq: u32,
    /// The partition directory, relative (`country=de/dt=2026-11-29`), or empty.
    pub partition: String,
    /// File extension without the dot (`parquet`, `jsonl`, `csv`).
    pub extension: &'static str,
}

impl FileName {
    /// The visible file name, e.g. `part-orders.0.0000000007.3.0000.parquet` (checkpoint 7, epoch 3, first file).
    pub fn visible(&self) -> String {
        format!(
            "{}{:010}.{}.{:04}.{}",
            Self::owner_prefix(&self.scope, self.subtask),
            self.checkpoint.0,
            self.epoch,
            self.seq,
            self.extension
        )
    }

    /// The visible path relative to the sink's base: `<partition>/<visible name>`.
    pub fn relative_path(&self) -> String {
        if self.partition.is_empty() {
            self.visible()
        } else {
            format!("{}/{}", self.partition, self.visible())
        }
    }

    /// The hidden name while rows are being written.
    pub fn in_progress(&self) -> String {
        format!(".{}.inprogress", self.visible())
    }

    /// The hidden name between pre-commit and commit.
    pub fn pending(&self) -> String {
        format!(".{}.pending", self.visible())
    }

    /// The prefix every file of one sink instance starts with (after the leading dot of hidden stages). The `.`
    /// separator cannot occur in a scope, so no instance's prefix is a prefix of another's.
    pub fn owner_prefix(scope: &SinkScope, subtask: SubtaskId) -> String {
        format!("part-{scope}.{subtask}.")
    }

    /// Whether the file name `name` (no directory) is a file of `scope`/`subtask`, visible or a hidden stage.
    pub fn is_owned(name: &str, scope: &SinkScope, subtask: SubtaskId) -> bool {
        name.trim_start_matches('.')
            .starts_with(&Self::owner_prefix(scope, subtask))
    }

    /// The visible name a hidden stage's name `name` publishes as (`.x.pending` → `x`).
    pub fn visible_of_stage(name: &str) -> &str {
        let name = name.strip_prefix('.').unwrap_or(name);
        name.strip_suffix(".pending")
            .or_else(|| name.strip_suffix(".inprogress"))
            .unwrap_or(name)
    }

    /// The checkpoint in the name of a file (visible or a stage) of `scope`/`subtask`.
    pub fn checkpoint_of(
        name: &str,
        scope: &SinkScope,
        subtask: SubtaskId,
    ) -> Option<CheckpointId> {
        let rest = name
            .trim_start_matches('.')
            .strip_prefix(&Self::owner_prefix(scope, subtask))?;
        rest.split('.').next()?.parse().ok().map(CheckpointId)
    }

    /// Whether `name` is a hidden stage (in-progress or pending) of a file owned by `scope`/`subtask`.
    pub fn is_owned_stage(name: &str, scope: &SinkScope, subtask: SubtaskId) -> bool {
        name.starts_with('.')
            && Self::is_owned(name, scope, subtask)
            && (name.ends_with(".inprogress") || name.ends_with(".pending"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name() -> FileName {
        FileName {
            scope: connector_api::SinkId::new("orders").unwrap().into(),
            subtask: SubtaskId(0),
            checkpoint: CheckpointId(7),
            epoch: 3,
            seq: 1,
            partition: "country=de".into(),
            extension: "parquet",
        }
    }

    #[test]
    fn stages_name_their_visible_file_and_checkpoint() {
        let name = name();
        assert_eq!(FileName::visible_of_stage(&name.pending()), name.visible());
        assert_eq!(
            FileName::visible_of_stage(&name.in_progress()),
            name.visible()
        );
        assert_eq!(
            FileName::checkpoint_of(&name.pending(), &name.scope, SubtaskId(0)),
            Some(CheckpointId(7))
        );
        assert_eq!(
            FileName::checkpoint_of(&name.pending(), &name.scope, SubtaskId(1)),
            None
        );
    }

    #[test]
    fn stages_are_hidden_and_owned_by_their_instance_only() {
        let name = name();
        assert_eq!(name.visible(), "part-orders.0.0000000007.3.0001.parquet");
        assert_eq!(
            name.relative_path(),
            "country=de/part-orders.0.0000000007.3.0001.parquet"
        );
        assert!(FileName::is_owned_stage(
            &name.pending(),
            &name.scope,
            SubtaskId(0)
        ));
        assert!(FileName::is_owned_stage(
            &name.in_progress(),
            &name.scope,
            SubtaskId(0)
        ));
        assert!(!FileName::is_owned_stage(
            &name.visible(),
            &name.scope,
            SubtaskId(0)
        ));
        assert!(!FileName::is_owned_stage(
            &name.pending(),
            &name.scope,
            SubtaskId(1)
        ));
        // Sink "orders-0" subtask 1 must not claim the files of sink "orders" subtask 0, nor the reverse.
        let dashed = FileName {
            scope: connector_api::SinkId::new("orders-0").unwrap().into(),
            subtask: SubtaskId(1),
            ..name.clone()
        };
        assert!(!FileName::is_owned_stage(
            &dashed.pending(),
            &name.scope,
            SubtaskId(0)
        ));
        assert!(!FileName::is_owned_stage(
            &name.pending(),
            &dashed.scope,
            SubtaskId(1)
        ));
    }
}
