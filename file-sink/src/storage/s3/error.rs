//! What an S3 call failed with, as the driver needs it.

use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use connector_api::{Error, ErrorKind, Phase};

/// What an S3 call failed with, as the driver needs it. `403`, a missing bucket and other client errors are
/// permanent and name the bucket and key; throttling, `5xx` and transport failures are retryable.
pub(super) fn s3_error<E>(
    op: &str,
    bucket: &str,
    key: &str,
    phase: Phase,
    e: SdkError<E, HttpResponse>,
) -> Error
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let status = e.raw_response().map(|r| r.status().as_u16());
    let code = e.code().unwrap_or("").to_string();
    let kind = if transient(&e) {
        ErrorKind::Retryable
    } else {
        ErrorKind::Fatal
    };
    let hint = match (status, code.as_str()) {
        (Some(403), _) | (_, "AccessDenied") => {
            ": access denied; check the credentials and the bucket policy"
        }
        (_, "NoSuchBucket") => ": the bucket does not exist; create it or fix `bucket`",
        _ => "",
    };
    let status = status.map_or("no response".to_string(), |s| format!("HTTP {s}"));
    Error::new(
        kind,
        phase,
        format!("S3 {op} of s3://{bucket}/{key} failed ({status} {code}){hint}"),
    )
    .with_txn(format!("s3://{bucket}/{key}"))
    .with_source(e)
}

pub(super) fn status_of<E>(e: &SdkError<E, HttpResponse>) -> Option<u16> {
    e.raw_response().map(|r| r.status().as_u16())
}

/// Throttling, `5xx` and transport failures: worth retrying.
pub(super) fn transient<E: ProvideErrorMetadata>(e: &SdkError<E, HttpResponse>) -> bool {
    matches!(
        e,
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_)
    ) || matches!(status_of(e), Some(429 | 500..=599))
        || matches!(
            e.code(),
            Some("SlowDown" | "RequestTimeout" | "InternalError" | "ServiceUnavailable")
        )
}
