//! What the JDBC sink stores in a checkpoint record (format version 1): the persisted type, and a golden-file test
//! that this release still reads what it wrote (`testdata/committable-v1.json`).

use connector_api::{Error, ErrorKind, Phase, Result};
use serde::{Deserialize, Serialize};

use crate::Xid;

/// What commits one checkpoint of one subtask: stored in the checkpoint record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JdbcCommittable {
    /// The transaction's global id (`ratchet.<sink>.<subtask>.<checkpoint>`).
    pub xid: String,
    /// `true`: a prepared transaction that commit finishes (xa mode). `false`: applied at pre-commit (upsert and
    /// append modes); commit has nothing left to do.
    pub prepared: bool,
}

impl JdbcCommittable {
    pub(crate) fn xid(&self) -> Result<Xid> {
        Xid::parse(&self.xid).ok_or_else(|| {
            Error::new(
                ErrorKind::Fatal,
                Phase::Recover,
                format!(
                    "the checkpoint holds the transaction id {:?}, which this release did not write",
                    self.xid
                ),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use connector_api::{CheckpointId, SubtaskId};

    use super::*;

    /// What this release writes, format version 1, kept as a file: if a change to the persisted types makes this
    /// fail, raise the sink's `committable_version`, teach its `decode_committable` to read version 1, and add the
    /// new version's golden file beside this one (checkpoints written by older releases must stay readable).
    const V1: &str = include_str!("../testdata/committable-v1.json");

    #[test]
    fn format_version_1_still_reads_and_writes_back_the_same() {
        let golden: Vec<JdbcCommittable> = serde_json::from_str(V1).unwrap();
        assert_eq!(
            serde_json::to_value(&golden).unwrap(),
            serde_json::from_str::<serde_json::Value>(V1).unwrap()
        );
        let job_scoped = golden[0].xid().unwrap();
        assert_eq!(
            (
                job_scoped.scope.to_string(),
                job_scoped.subtask,
                job_scoped.checkpoint
            ),
            ("orders~db".to_string(), SubtaskId(0), CheckpointId(17))
        );
        assert!(golden[0].prepared);
        // A sink-scoped id, as jobs from before job scoping wrote it.
        let sink_scoped = golden[1].xid().unwrap();
        assert_eq!(
            (sink_scoped.scope.to_string(), sink_scoped.subtask),
            ("db".to_string(), SubtaskId(3))
        );
        assert!(!golden[1].prepared);
    }
}
