//! Mapping iceberg errors to what the driver does about them.

use std::future::Future;
use std::time::Duration;

use connector_api::{Error, ErrorKind, Phase, Result};

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

/// What a catalog's failure at start-up (opening it, looking up or creating the namespace and the table) means
/// to the worker: a request the catalog refuses, which retrying cannot change (iceberg's `DataInvalid` or
/// `FeatureUnsupported`: a bad name, a credential the catalog rejects; or a REST catalog's HTTP 4xx other than 408
/// and 429: no permission, a wrong warehouse), is [`Config`](ErrorKind::Config); anything else (unreachable,
/// restarting, a connection reset, an HTTP 5xx) may pass by itself and is [`Retryable`](ErrorKind::Retryable).
pub(crate) fn setup_kind(e: &iceberg::Error) -> ErrorKind {
    match e.kind() {
        iceberg::ErrorKind::DataInvalid | iceberg::ErrorKind::FeatureUnsupported => {
            ErrorKind::Config
        }
        _ => match http_status(e) {
            Some(status) if (400..500).contains(&status) && status != 408 && status != 429 => {
                ErrorKind::Config
            }
            _ => ErrorKind::Retryable,
        },
    }
}

/// The HTTP status a REST catalog answered with, when `e` carries one: iceberg-rust records it only in the
/// error's context (`status: 403 Forbidden`), which it shows in the error's text before the message.
fn http_status(e: &iceberg::Error) -> Option<u16> {
    let text = e.to_string();
    let (_, after) = text.split_once("status: ")?;
    after.get(..3)?.parse().ok()
}

/// Runs one catalog call of a sink's start or check within `limit` (the sink's `commit_timeout`, the longest one
/// catalog call may take): a catalog that hangs instead of answering is reported, never waited on.
///
/// # Errors
/// [`Retryable`](ErrorKind::Retryable) naming `what` (e.g. "a lookup of table ns.t") when the call took longer than
/// `limit`; the call's own error otherwise.
pub(crate) async fn within<T>(
    limit: Duration,
    what: &str,
    call: impl Future<Output = Result<T>>,
) -> Result<T> {
    connector_api::bounded(
        limit,
        (ErrorKind::Retryable, Phase::Setup),
        || {
            format!(
                "the catalog did not answer {what} within commit_timeout ({limit:?}); check that it is \
                 reachable, or raise commit_timeout"
            )
        },
        call,
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rest_error(status: &str) -> iceberg::Error {
        // As iceberg-rust's REST client builds it for an unexpected status.
        iceberg::Error::new(
            iceberg::ErrorKind::Unexpected,
            "Received response with unexpected status code",
        )
        .with_context("status", status)
        .with_context("headers", "{\"content-type\": \"status: 500\"}")
    }

    #[test]
    fn a_refusal_that_retrying_cannot_change_is_a_config_error() {
        assert_eq!(setup_kind(&rest_error("403 Forbidden")), ErrorKind::Config);
        assert_eq!(setup_kind(&rest_error("404 Not Found")), ErrorKind::Config);
        let invalid = iceberg::Error::new(iceberg::ErrorKind::DataInvalid, "OAuthError: bad");
        assert_eq!(setup_kind(&invalid), ErrorKind::Config);
    }

    #[test]
    fn a_failure_that_may_pass_is_retryable() {
        for status in [
            "500 Internal Server Error",
            "503 Service Unavailable",
            "429 Too Many Requests",
            "408 Request Timeout",
        ] {
            assert_eq!(
                setup_kind(&rest_error(status)),
                ErrorKind::Retryable,
                "{status}"
            );
        }
        let unreachable = iceberg::Error::new(
            iceberg::ErrorKind::Unexpected,
            "Failed to execute http request",
        );
        assert_eq!(setup_kind(&unreachable), ErrorKind::Retryable);
    }

    #[tokio::test]
    async fn a_call_that_hangs_past_its_limit_is_retryable_and_named() {
        let hung = within(
            Duration::from_millis(20),
            "a lookup of table ns.t",
            std::future::pending::<Result<()>>(),
        );
        let e = hung.await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Retryable);
        assert!(
            e.to_string()
                .contains("did not answer a lookup of table ns.t within commit_timeout"),
            "{e}"
        );
    }
}
