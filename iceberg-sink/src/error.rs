//! Mapping iceberg errors to what the driver does about them.

use connector_api::{Error, ErrorKind, Phase};

/// Commit conflicts are retryable (reload and re-check); everything else from iceberg is fatal. iceberg-rust
/// turns a REST catalog's HTTP 5xx into `Unexpected`: the commit may or may not have happened, so the caller must
/// reload and look at the history before deciding, never blindly retry.
pub(crate) fn iceberg_error(phase: Phase, message: impl Into<String>, e: iceberg::Error) -> Error {
    let kind = match e.kind() {
        iceberg::ErrorKind::CatalogCommitConflicts => ErrorKind::Retryable,
        _ if e.retryable() => ErrorKind::Retryable,
        _ => ErrorKind::Fatal,
    };
    Error::new(kind, phase, message).with_source(e)
}
