//! Opening a transactional producer.

use std::time::Duration;

use connector_api::{Error, Phase, Result};
use rdkafka::producer::{Producer, ProducerContext, ThreadedProducer};

use crate::{KafkaSinkConfig, TransactionalId, classify};

/// How long `init_transactions` may take (it waits for the coordinator and for the previous epoch's transaction
/// to be aborted).
const INIT_TIMEOUT: Duration = Duration::from_secs(60);

/// How long librdkafka's transactional calls (commit, abort, sending offsets) may block.
pub(crate) const TXN_TIMEOUT: Duration = Duration::from_secs(60);

/// Creates the producer for transactional id `id`, with `context` (the sinks track deliveries in theirs,
/// Kafka-to-Kafka uses librdkafka's default) and librdkafka's own delivery thread, and calls `init_transactions`.
///
/// # Details
/// `init_transactions` bumps the id's producer epoch: an older producer with the same id is fenced (its next
/// transactional call fails with a fenced error) and any transaction it left open is aborted by the broker, so
/// read_committed readers move past it. It blocks up to one minute; it runs on the blocking thread pool.
///
/// # Errors
/// [`Config`](connector_api::ErrorKind::Config) for bad settings; otherwise classified by [`classify`] with the
/// transactional id attached.
pub async fn open_transactional_producer<C: ProducerContext + 'static>(
    config: &KafkaSinkConfig,
    id: &TransactionalId,
    context: C,
) -> Result<ThreadedProducer<C>> {
    let producer: ThreadedProducer<C> = config
        .producer_config(id)?
        .create_with_context(context)
        .map_err(|e| {
            Error::new(
                classify(&e),
                Phase::Setup,
                "cannot create the Kafka producer",
            )
            .with_txn(id.as_str())
            .with_source(e)
        })?;
    connector_api::blocking(Phase::Setup, "init_transactions", move || {
        producer.init_transactions(INIT_TIMEOUT).map(|()| producer)
    })
    .await?
    .map_err(|e| {
        Error::new(classify(&e), Phase::Setup, "init_transactions failed")
            .with_txn(id.as_str())
            .with_source(e)
    })
}
