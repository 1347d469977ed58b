//! Why a transform could not produce a batch's rows: the transform, the expression that failed, and what
//! DataFusion said.

use std::fmt;

use connector_api::{Error, ErrorKind, Phase};

/// An expression of a transform failed on a batch (a cast that does not fit, a JSON path into a non-object):
/// the batch holds at least one row the transform cannot take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The transform's name.
    pub transform: String,
    /// The expression that failed, as DataFusion prints it (`CAST(input.price AS Decimal128(10, 2)) AS price`,
    /// or `WHERE <predicate>`).
    pub expression: String,
    /// What the evaluation said.
    pub message: String,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "transform {:?}: expression `{}` failed: {}",
            self.transform, self.expression, self.message
        )
    }
}

impl std::error::Error for Failure {}

impl From<Failure> for Error {
    /// A [`BadRecord`](ErrorKind::BadRecord): the input, not the job, is at fault.
    fn from(failure: Failure) -> Self {
        Error::new(ErrorKind::BadRecord, Phase::Write, failure.to_string())
    }
}
