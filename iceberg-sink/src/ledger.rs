//! Where a subtask's progress and ownership live in the table itself: the summary of every snapshot the sink
//! commits, and one table property per subtask that survives snapshot expiry.
//!
//! Each snapshot Ratchet commits names the job, sink and subtask it belongs to, the newest checkpoint it makes
//! visible, and the owner epoch of the instance that committed it. Recovery raises the epoch with a snapshot of
//! its own (no data files), so a commit planned by an older instance finds the table moved and is refused (see
//! [`crate::commit`]).

use std::collections::HashMap;

use connector_api::{CheckpointId, SinkId, SubtaskId};
use iceberg::spec::TableMetadataRef;
use iceberg::util::snapshot::ancestors_of;

/// Snapshot summary key: the stable job identity from config.
pub const JOB_PROPERTY: &str = "ratchet.job";
/// Snapshot summary key: the sink id.
pub const SINK_PROPERTY: &str = "ratchet.sink";
/// Snapshot summary key: the subtask.
pub const SUBTASK_PROPERTY: &str = "ratchet.subtask";
/// Snapshot summary key: the newest checkpoint of the subtask the snapshot makes visible.
pub const CHECKPOINT_PROPERTY: &str = "ratchet.checkpoint";
/// Snapshot summary key: the owner epoch of the instance that committed the snapshot.
pub const EPOCH_PROPERTY: &str = "ratchet.epoch";

/// One subtask of one sink of one job: whose snapshots, files and epoch these are.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SubtaskKey {
    /// The job identity from config (stable across restarts and replacements of the process).
    pub job: SinkId,
    /// The sink.
    pub sink: SinkId,
    /// The subtask.
    pub subtask: SubtaskId,
}

/// What the table says about one subtask.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SubtaskState {
    /// The owner epoch of the newest instance that recovered (0: none yet).
    pub epoch: u64,
    /// The newest checkpoint the table shows (`None`: nothing committed yet).
    pub checkpoint: Option<CheckpointId>,
}

impl SubtaskKey {
    /// The table property that mirrors the subtask's state (`ratchet.<job>.<sink>.<subtask>` = `<epoch>:<checkpoint>`).
    pub fn table_property(&self) -> String {
        format!("ratchet.{}.{}.{}", self.job, self.sink, self.subtask)
    }

    /// The start of the name of every data file this subtask writes: `ratchet.<job>.<sink>.<subtask>.` (ids
    /// cannot contain dots, so no other subtask's prefix starts with it).
    pub fn file_prefix(&self) -> String {
        format!("{}.", self.table_property())
    }

    /// The owner epoch and checkpoint in the name of one of this subtask's data files
    /// (`<prefix>e<epoch>.c<checkpoint>-<n>...`, after any directory); `None` for any other name, including one
    /// that merely starts with the prefix.
    pub fn file_stamp(&self, path: &str) -> Option<(u64, CheckpointId)> {
        let name = path.rsplit('/').next()?;
        let rest = name.strip_prefix(&self.file_prefix())?.strip_prefix('e')?;
        let (epoch, rest) = rest.split_once(".c")?;
        let (checkpoint, _) = rest.split_once('-')?;
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(epoch) || !digits(checkpoint) {
            return None;
        }
        Some((epoch.parse().ok()?, CheckpointId(checkpoint.parse().ok()?)))
    }

    /// The checkpoint in the name of one of this subtask's data files ([`file_stamp`](Self::file_stamp)).
    pub fn checkpoint_of_file(&self, path: &str) -> Option<CheckpointId> {
        self.file_stamp(path).map(|(_, checkpoint)| checkpoint)
    }

    /// The snapshot summary properties recording `state` for this subtask.
    pub fn summary(&self, state: SubtaskState) -> HashMap<String, String> {
        let mut summary = HashMap::from([
            (JOB_PROPERTY.to_string(), self.job.to_string()),
            (SINK_PROPERTY.to_string(), self.sink.to_string()),
            (SUBTASK_PROPERTY.to_string(), self.subtask.to_string()),
            (EPOCH_PROPERTY.to_string(), state.epoch.to_string()),
        ]);
        if let Some(checkpoint) = state.checkpoint {
            summary.insert(CHECKPOINT_PROPERTY.to_string(), checkpoint.to_string());
        }
        summary
    }

    pub(crate) fn owns(&self, summary: &HashMap<String, String>) -> bool {
        let is = |key: &str, value: &str| summary.get(key).map(String::as_str) == Some(value);
        is(JOB_PROPERTY, self.job.as_str())
            && is(SINK_PROPERTY, self.sink.as_str())
            && is(SUBTASK_PROPERTY, &self.subtask.to_string())
    }

    /// The subtask's state in `metadata`: from the newest of its snapshots in the ancestry of the current
    /// snapshot; when the ancestry holds none (expired, or never written), from the table property.
    pub fn state(&self, metadata: &TableMetadataRef) -> SubtaskState {
        let from_history = metadata.current_snapshot_id().and_then(|current| {
            ancestors_of(metadata, current).find_map(|snapshot| {
                let summary = &snapshot.summary().additional_properties;
                self.owns(summary).then(|| SubtaskState {
                    epoch: parse_u64(summary.get(EPOCH_PROPERTY)).unwrap_or(0),
                    checkpoint: parse_u64(summary.get(CHECKPOINT_PROPERTY)).map(CheckpointId),
                })
            })
        });
        from_history
            .or_else(|| parse_property(metadata.properties().get(&self.table_property())?))
            .unwrap_or_default()
    }
}

impl SubtaskState {
    /// The value of [`SubtaskKey::table_property`].
    pub fn property_value(&self) -> String {
        match self.checkpoint {
            Some(checkpoint) => format!("{}:{checkpoint}", self.epoch),
            None => format!("{}:", self.epoch),
        }
    }
}

fn parse_u64(value: Option<&String>) -> Option<u64> {
    value?.parse().ok()
}

fn parse_property(value: &str) -> Option<SubtaskState> {
    let (epoch, checkpoint) = value.split_once(':')?;
    Some(SubtaskState {
        epoch: epoch.parse().ok()?,
        checkpoint: if checkpoint.is_empty() {
            None
        } else {
            Some(CheckpointId(checkpoint.parse().ok()?))
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_property_round_trips() {
        for state in [
            SubtaskState::default(),
            SubtaskState {
                epoch: 7,
                checkpoint: Some(CheckpointId(42)),
            },
        ] {
            assert_eq!(parse_property(&state.property_value()), Some(state));
        }
        assert_eq!(parse_property("x:1"), None);
    }

    #[test]
    fn prefixes_of_different_subtasks_never_nest() {
        let key = |subtask| SubtaskKey {
            job: SinkId::new("job").unwrap(),
            sink: SinkId::new("lake").unwrap(),
            subtask: SubtaskId(subtask),
        };
        assert!(!key(10).file_prefix().starts_with(&key(1).file_prefix()));
        let file = format!("s3://b/t/data/{}e3.c42-00001.parquet", key(1).file_prefix());
        assert_eq!(key(1).checkpoint_of_file(&file), Some(CheckpointId(42)));
        assert_eq!(key(1).file_stamp(&file), Some((3, CheckpointId(42))));
        assert_eq!(key(10).checkpoint_of_file(&file), None);
    }

    #[test]
    fn only_names_the_sink_writes_carry_a_stamp() {
        let key = SubtaskKey {
            job: SinkId::new("a").unwrap(),
            sink: SinkId::new("b").unwrap(),
            subtask: SubtaskId(0),
        };
        let prefix = key.file_prefix();
        for foreign in [
            format!("{prefix}x.1.e3.c5-00000.parquet"),
            format!("{prefix}e.c5-00000.parquet"),
            format!("{prefix}e3.c-00000.parquet"),
            format!("{prefix}e3.c5.parquet"),
            "ratchet.a.b.1.e3.c5-00000.parquet".to_string(),
        ] {
            assert_eq!(key.file_stamp(&foreign), None, "{foreign}");
        }
    }
}
