//! Mapping librdkafka errors to what the driver does about them.

use connector_api::{Error, ErrorKind, Phase};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// The driver's view of a Kafka error, after librdkafka's own advice: fatal errors (a fenced producer among them)
/// stop this instance, `txn_requires_abort` errors abort and replay, retriable ones retry; anything unclassified
/// is fatal.
pub fn classify(error: &KafkaError) -> ErrorKind {
    if let KafkaError::Transaction(e) = error {
        if is_fence(e.code()) {
            return ErrorKind::Fenced;
        }
        if e.is_fatal() {
            return ErrorKind::Fatal;
        }
        if e.txn_requires_abort() {
            return ErrorKind::MustAbort;
        }
        if e.is_retriable() {
            return ErrorKind::Retryable;
        }
        return ErrorKind::Fatal;
    }
    match error.rdkafka_error_code() {
        Some(
            RDKafkaErrorCode::QueueFull
            | RDKafkaErrorCode::MessageTimedOut
            | RDKafkaErrorCode::RequestTimedOut
            | RDKafkaErrorCode::AllBrokersDown
            | RDKafkaErrorCode::BrokerTransportFailure
            | RDKafkaErrorCode::NetworkException
            | RDKafkaErrorCode::NotCoordinator
            | RDKafkaErrorCode::CoordinatorLoadInProgress
            | RDKafkaErrorCode::CoordinatorNotAvailable,
        ) => ErrorKind::Retryable,
        Some(code) if is_fence(code) => ErrorKind::Fenced,
        Some(RDKafkaErrorCode::MessageSizeTooLarge | RDKafkaErrorCode::InvalidRecord) => {
            ErrorKind::BadRecord
        }
        _ => ErrorKind::Fatal,
    }
}

/// Whether `code` says a newer instance with this transactional id fenced the producer.
pub(crate) fn is_fence(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::Fenced
            | RDKafkaErrorCode::ProducerFenced
            | RDKafkaErrorCode::InvalidProducerEpoch
    )
}

/// A librdkafka error in `phase`, classified ([`classify`]), with `message` and the error as its source.
pub(crate) fn kafka_error(phase: Phase, message: &str, e: KafkaError) -> Error {
    Error::new(classify(&e), phase, message).with_source(e)
}
