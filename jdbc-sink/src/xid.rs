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

/// The longest scope a MySQL/MariaDB gtrid holds as it is (64 bytes with the prefix, the subtask and the
/// checkpoint at their longest).
const MAX_MYSQL_SCOPE: usize = 64 - PREFIX.len() - 1 - 10 - 1 - 20;

impl Xid {
    /// The global transaction id on MySQL/MariaDB, which allows 64 bytes: the id itself when its scope fits, or
    /// with the scope replaced by `#` and 16 hexadecimal digits of its hash (a scope never contains `#`), so any
    /// valid job name and sink id fit.
    pub(crate) fn mysql_gtrid(&self) -> String {
        format!(
            "{PREFIX}{}.{}.{}",
            mysql_scope(&self.scope),
            self.subtask,
            self.checkpoint
        )
    }

    /// The xid of `scope` whose MySQL/MariaDB gtrid is `gtrid`, if it is one of that scope's.
    pub(crate) fn from_mysql_gtrid(gtrid: &str, scope: &SinkScope) -> Option<Xid> {
        let rest = gtrid
            .strip_prefix(PREFIX)?
            .strip_prefix(mysql_scope(scope).as_str())?
            .strip_prefix('.')?;
        let (subtask, checkpoint) = rest.split_once('.')?;
        Some(Xid {
            scope: scope.clone(),
            subtask: SubtaskId(subtask.parse().ok()?),
            checkpoint: CheckpointId(checkpoint.parse().ok()?),
        })
    }
}

/// `scope`, or `#` and its FNV-1a hash when it is too long for a MySQL gtrid.
fn mysql_scope(scope: &SinkScope) -> String {
    let text = scope.as_str();
    if text.len() <= MAX_MYSQL_SCOPE {
        return text.to_string();
    }
    let hash = text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    format!("#{hash:016x}")
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
    fn long_scopes_fit_a_mysql_gtrid() {
        let job = connector_api::JobId::new("a".repeat(64)).unwrap();
        let sink = connector_api::SinkId::new("b".repeat(64)).unwrap();
        let scope = SinkScope::new(Some(&job), &sink);
        let xid = Xid {
            scope: scope.clone(),
            subtask: SubtaskId(u32::MAX),
            checkpoint: CheckpointId(u64::MAX),
        };
        let gtrid = xid.mysql_gtrid();
        assert!(gtrid.len() <= 64, "{gtrid}");
        assert_eq!(Xid::from_mysql_gtrid(&gtrid, &scope), Some(xid.clone()));
        let other = SinkScope::new(
            Some(&job),
            &connector_api::SinkId::new("c".repeat(64)).unwrap(),
        );
        assert_eq!(Xid::from_mysql_gtrid(&gtrid, &other), None);
        let short = Xid {
            scope: SinkScope::from(connector_api::SinkId::new("db").unwrap()),
            ..xid
        };
        assert_eq!(
            short.mysql_gtrid(),
            short.to_string(),
            "short scopes keep their ids"
        );
    }

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
