//! What can go wrong talking to the registry, and which of it is worth retrying.

use connector_api::ErrorKind;

/// A failed registry request. The message names the registry (its URL without credentials) and the request.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The settings cannot make a client: a URL that does not parse, credentials given twice, an unreadable CA
    /// file or client certificate.
    #[error("schema registry settings: {0}")]
    Settings(String),
    /// No answer: connection refused or reset, TLS handshake failed, or no reply within the request timeout.
    #[error("the schema registry at {url} did not answer {request}")]
    Unavailable {
        /// The registry's URL, without credentials.
        url: String,
        /// The request, e.g. `GET /schemas/ids/7`.
        request: String,
        /// The HTTP client's error.
        #[source]
        source: reqwest::Error,
    },
    /// The TLS handshake failed on what the client checks: the server's certificate (not signed by a trusted CA,
    /// another name) or the client's own. Not retried: the settings or the certificates must change.
    #[error("the schema registry at {url} failed the TLS checks for {request}: {reason}")]
    Tls {
        /// The registry's URL, without credentials.
        url: String,
        /// The request.
        request: String,
        /// rustls's reason.
        reason: String,
        /// The HTTP client's error.
        #[source]
        source: reqwest::Error,
    },
    /// The registry answered with an error status (4xx: refused; 5xx: failed).
    #[error("the schema registry at {url} answered {request} with HTTP {status}{}: {message}", .code.map(|c| format!(" (error code {c})")).unwrap_or_default())]
    Status {
        /// The registry's URL, without credentials.
        url: String,
        /// The request.
        request: String,
        /// The HTTP status.
        status: u16,
        /// The registry's `error_code`, when its body has one (40401: subject not found, 40403: schema not found).
        code: Option<u32>,
        /// The registry's `message`, or the body.
        message: String,
    },
    /// The registry answered 2xx with a body that is not what the API describes.
    #[error(
        "the schema registry at {url} answered {request} with a body that is not a schema: {reason}"
    )]
    Malformed {
        /// The registry's URL, without credentials.
        url: String,
        /// The request.
        request: String,
        /// What is wrong with it.
        reason: String,
    },
}

impl RegistryError {
    /// Whether trying again may help: no answer, or a server error (5xx) or throttling (429).
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Unavailable { .. } => true,
            Self::Status { status, .. } => *status >= 500 || *status == 429,
            Self::Settings(_) | Self::Tls { .. } | Self::Malformed { .. } => false,
        }
    }

    /// Whether the registry answered that what was asked for does not exist (HTTP 404).
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::Status { status: 404, .. })
    }

    /// The kind of Ratchet error this is: [`Retryable`](ErrorKind::Retryable) when
    /// [transient](Self::is_transient) (the client's own retries already ran out), [`Config`](ErrorKind::Config)
    /// otherwise (bad settings or credentials, a subject that does not exist, a registry that speaks another API).
    pub fn kind(&self) -> ErrorKind {
        if self.is_transient() {
            ErrorKind::Retryable
        } else {
            ErrorKind::Config
        }
    }
}
