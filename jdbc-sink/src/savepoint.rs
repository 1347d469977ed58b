//! The savepoint both dialects put around one `write`, so a refused batch leaves the transaction as it was (the
//! driver then dead-letters or bisects it) and an applied one is kept whole, never half.

use connector_api::{ErrorKind, Result};

/// Opens the write savepoint.
pub(crate) const OPEN: &str = "SAVEPOINT ratchet_write";

/// What closes the write savepoint after `outcome`, with the message for its own failure: a release when the write
/// succeeded, a rollback to it when the batch was refused ([`BadRecord`](ErrorKind::BadRecord)), nothing for any
/// other error (the connection and its transaction are lost anyway; the outcome is returned as it is).
pub(crate) fn closing(outcome: &Result<()>) -> Option<(&'static str, &'static str)> {
    match outcome {
        Ok(()) => Some((
            "RELEASE SAVEPOINT ratchet_write",
            "RELEASE SAVEPOINT failed",
        )),
        Err(e) if e.kind() == ErrorKind::BadRecord => Some((
            "ROLLBACK TO SAVEPOINT ratchet_write",
            "ROLLBACK TO SAVEPOINT failed",
        )),
        Err(_) => None,
    }
}
