//! Deterministic transaction ids for prepared transactions.

use std::fmt;

use connector_api::{CheckpointId, SinkScope, SubtaskId};

/// The global id of one sink instance's prepared transaction for one checkpoint: `ratchet.<scope>.<subtask>.<cp>`.
///
/// The scope is `<job>~<sink>` ([`SinkScope`]; the sink id alone for jobs from before job scoping), unless the
/// sink's settings give one. The `.` separator cannot occur in it, so the id parses back unambiguously and one instance's ids are
/// never mistaken for another's.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Xid {
    /// The owning sink's scope (its id unless configured).
    pub scope: SinkScope,
    /// The owning subtask.
    pub subtask: SubtaskId,
    /// The checkpoint the transaction belongs to.
    pub checkpoint: CheckpointId,
}

const PREFIX: &str = "ratchet.";

impl Xid {
    /// The prefix shared by every xid of one sink instance (for listing what it owns).
    pub fn owner_prefix(scope: &SinkScope, subtask: SubtaskId) -> String {
        format!("{PREFIX}{scope}.{subtask}.")
    }

    /// The prefix shared by every xid of one sink, all subtasks (for recovery after the subtask count changed).
    pub fn sink_prefix(scope: &SinkScope) -> String {
        format!("{PREFIX}{scope}.")
    }

    /// `err` with the checkpoint and transaction of `xid`, when there is one.
    pub(crate) fn locate(err: connector_api::Error, xid: Option<&Xid>) -> connector_api::Error {
        match xid {
            Some(xid) => err
                .with_checkpoint(xid.checkpoint)
                .with_txn(xid.to_string()),
            None => err,
        }
    }

    /// Parses an xid written by [`Xid`]'s `Display`; `None` for ids Ratchet did not write.
    pub fn parse(gid: &str) -> Option<Xid> {
        let mut parts = gid.strip_prefix(PREFIX)?.split('.');
        let scope = SinkScope::parse(parts.next()?)?;
        let subtask = SubtaskId(parts.next()?.parse().ok()?);
        let checkpoint = CheckpointId(parts.next()?.parse().ok()?);
        parts.next().is_none().then_some(Xid {
            scope,
            subtask,
            checkpoint,
        })
    }
}

impl fmt::Display for Xid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}{}",
            Self::owner_prefix(&self.scope, self.subtask),
            self.checkpoint
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_foreign_ids() {
        let xid = Xid {
            scope: SinkScope::from(connector_api::SinkId::new("orders-db").unwrap()),
            subtask: SubtaskId(2),
            checkpoint: CheckpointId(41),
        };
        assert_eq!(xid.to_string(), "ratchet.orders-db.2.41");
        assert_eq!(Xid::parse(&xid.to_string()), Some(xid));
        for foreign in [
            "flink-xa-1",
            "ratchet.a.b.1",
            "ratchet.a.1.2.3",
            "ratchet.a.1",
        ] {
            assert_eq!(Xid::parse(foreign), None, "{foreign}");
        }
    }
}
