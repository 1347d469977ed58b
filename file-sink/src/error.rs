//! The file sink's protocol errors (storage errors are classified where they happen, in `storage`).

use connector_api::{Error, ErrorKind, Phase};

/// The error of an instance whose owner epoch `held` was overtaken by a newer instance's `current`.
pub(crate) fn zombie(phase: Phase, current: u64, held: u64) -> Error {
    Error::new(
        ErrorKind::Fenced,
        phase,
        format!(
            "a newer instance of this sink (owner epoch {current}, this one holds {held}) has recovered; this \
             instance is a zombie and must stop"
        ),
    )
}
