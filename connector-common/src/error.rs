//! The errors of this crate's helpers: small on purpose, so callers map them into their own error types.

use std::fmt;

/// What a caller can do about an [`Error`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The configuration is wrong (a malformed URL, an unreadable certificate, half a credential pair): fix it
    /// and start again; retrying cannot help.
    Config,
    /// The server could not be reached, refused the login or the connection failed: it may work on a later try.
    Unavailable,
}

/// An error from one of this crate's helpers: a message for the user and the underlying cause, if any.
///
/// The message never repeats the cause: print the chain (`source()`) to see it.
#[derive(Debug)]
pub struct Error {
    kind: ErrorKind,
    message: String,
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A configuration error with `message`.
    pub fn config(message: impl Into<String>) -> Self {
        Self {
            kind: ErrorKind::Config,
            message: message.into(),
            source: None,
        }
    }

    /// A server that could not be reached or used, with `message`.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self {
            kind: ErrorKind::Unavailable,
            message: message.into(),
            source: None,
        }
    }

    /// Attaches the underlying cause.
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }

    /// What a caller can do about it.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message, without the cause.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Takes the cause out, for callers that re-wrap the error in their own type.
    pub fn into_source(self) -> Option<Box<dyn std::error::Error + Send + Sync + 'static>> {
        self.source
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}
