//! The demo's input: JSON orders produced to Kafka at a steady rate, so the worker is mid-run when it is killed.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{FutureProducer, FutureRecord};

use super::job::{Names, PARTITIONS};

/// Records per burst; one burst every [`PAUSE`]: about 5,000 records/s.
const BURST: u64 = 500;
const PAUSE: Duration = Duration::from_millis(100);

/// Creates the input and the Kafka sink's output topic.
///
/// # Errors
/// The cluster refuses (the error named).
pub async fn create_topics(bootstrap: &str, names: &Names) -> Result<()> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .context("cannot create a Kafka admin client")?;
    let topics = [
        NewTopic::new(&names.topic, PARTITIONS, TopicReplication::Fixed(1)),
        NewTopic::new(&names.copy_topic, PARTITIONS, TopicReplication::Fixed(1)),
    ];
    let created = admin
        .create_topics(
            &topics,
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
        )
        .await
        .with_context(|| format!("cannot create topics on {bootstrap}"))?;
    for result in created {
        if let Err((topic, code)) = result {
            bail!("cannot create topic {topic}: {code}");
        }
    }
    Ok(())
}

/// Produces orders `0..records` to `topic` (acknowledged by the broker: acks=all, idempotent), counting them in
/// `produced`.
///
/// # Errors
/// A record the broker did not take.
pub async fn produce(
    bootstrap: String,
    topic: String,
    records: u64,
    produced: Arc<AtomicU64>,
) -> Result<()> {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .create()
        .context("cannot create the generator's producer")?;
    let mut next = 0;
    while next < records {
        let end = (next + BURST).min(records);
        let mut deliveries = Vec::with_capacity((end - next) as usize);
        for id in next..end {
            let value = format!(
                r#"{{"id":{id},"customer":"customer-{}","amount_cents":{}}}"#,
                id % 97,
                (id * 7919) % 100_000
            );
            let delivery = producer
                .send_result(
                    FutureRecord::to(&topic)
                        .key(&id.to_string())
                        .payload(&value),
                )
                .map_err(|(e, _)| anyhow::anyhow!("cannot enqueue order {id}: {e}"))?;
            deliveries.push((id, delivery));
        }
        for (id, delivery) in deliveries {
            delivery
                .await
                .context("the producer went away")?
                .map_err(|(e, _)| anyhow::anyhow!("order {id} was not delivered: {e}"))?;
        }
        produced.store(end, Ordering::Relaxed);
        next = end;
        tokio::time::sleep(PAUSE).await;
    }
    Ok(())
}
