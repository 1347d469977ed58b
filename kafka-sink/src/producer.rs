//! Opening a transactional producer.

use std::time::Duration;

use connector_api::{Error, Phase, Result};
use rdkafka::config::FromClientConfig;
use rdkafka::producer::{Producer, ProducerContext};

use crate::{KafkaSinkConfig, TransactionalId, classify};

/// How long `init_transactions` may take (it waits for the coordinator and for the previous epoch's transaction
/// to be aborted).
const INIT_TIMEOUT: Duration = Duration::from_secs(60);

/// Creates the producer (any kind: `FutureProducer` for the sink, `ThreadedProducer` for Kafka-to-Kafka) for
/// transactional id `id` and calls `init_transactions`.
///
/// # Details
/// `init_transactions` bumps the id's producer epoch: an older producer with the same id is fenced (its next
/// transactional call fails with a fenced error) and any transaction it left open is aborted by the broker, so
/// read_committed readers move past it. It blocks up to one minute; it runs on the blocking thread pool.
///
/// # Errors
/// [`Config`](connector_api::ErrorKind::Config) for bad settings; otherwise classified by [`classify`] with the
/// transactional id attached.
pub async fn open_transactional_producer<P, C>(
    config: &KafkaSinkConfig,
    id: &TransactionalId,
) -> Result<P>
where
    P: Producer<C> + FromClientConfig + Send + 'static,
    C: ProducerContext + 'static,
{
    let producer: P = config.producer_config(id)?.create().map_err(|e| {
        Error::new(
            classify(&e),
            Phase::Setup,
            "cannot create the Kafka producer",
        )
        .with_txn(id.as_str())
        .with_source(e)
    })?;
    tokio::task::spawn_blocking(move || producer.init_transactions(INIT_TIMEOUT).map(|()| producer))
        .await
        .expect("init_transactions task panicked")
        .map_err(|e| {
            Error::new(classify(&e), Phase::Setup, "init_transactions failed")
                .with_txn(id.as_str())
                .with_source(e)
        })
}
