//! The JDBC sink's protocol errors: an instance overtaken by a newer one, a prepared transaction lost.

use connector_api::{Error, ErrorKind, Phase};

use crate::Xid;

/// The error of an instance whose owner epoch is no longer the newest.
pub(crate) fn fenced(xid: &Xid, epoch: u64) -> Error {
    Error::new(
        ErrorKind::Fenced,
        Phase::PreCommit,
        format!(
            "a newer instance of subtask {} recovered (the owner epoch moved past {epoch}): this instance must \
             stop; its transaction was rolled back",
            xid.subtask
        ),
    )
    .with_checkpoint(xid.checkpoint)
    .with_txn(xid.to_string())
}

/// The error for a prepared transaction that is gone without having committed.
pub(crate) fn lost_transaction(xid: &Xid) -> Error {
    Error::new(
        ErrorKind::Fatal,
        Phase::Commit,
        "the prepared transaction is gone and was never committed (rolled back outside Ratchet?): the rows of \
         this checkpoint are lost; replay the source from the previous checkpoint",
    )
    .with_checkpoint(xid.checkpoint)
    .with_txn(xid.to_string())
}
