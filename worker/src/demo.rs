//! `ratchet demo`: Kafka → exactly-once local Parquet files, through the checkpoint driver.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use connector_api::{Driver, DriverConfig, LocalCheckpointStore, Report, SinkId, SubtaskId};
use file_sink::{FileSink, FileSinkConfig, StorageConfig};
use kafka_source::{KafkaConnection, KafkaSource, KafkaSourceOptions, text_schema};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::types::RDKafkaErrorCode;

use crate::cli::DemoArgs;
use crate::summary::summarize;

/// How long the source waits for more records before checkpointing what it has.
const IDLE: Duration = Duration::from_millis(500);

/// How long the demo waits for the Kafka cluster to answer before it gives up with the address.
const KAFKA_REACHABLE_WITHIN: Duration = Duration::from_secs(10);

/// Runs the demo pipeline.
pub async fn run(args: DemoArgs) -> Result<()> {
    let topic = match &args.topic {
        Some(topic) => topic.clone(),
        None => format!(
            "ratchet-demo-{}",
            SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs()
        ),
    };
    // Fail fast and say where, instead of waiting in librdkafka's reconnect loop (within the 30 s budget).
    KafkaConnection::plaintext(&args.bootstrap)
        .check_reachable(KAFKA_REACHABLE_WITHIN)
        .await
        .map_err(report)?;
    create_topic(&args.bootstrap, &topic, args.partitions).await?;
    if args.records > 0 {
        produce(&args.bootstrap, &topic, args.records).await?;
        println!(
            "produced {} records to {topic} on {}",
            args.records, args.bootstrap
        );
    }

    let store = LocalCheckpointStore::open(&args.state, 5)?;
    let sink = FileSink::new(FileSinkConfig::new(
        SinkId::new("demo-parquet")?,
        SubtaskId(0),
        text_schema(),
        StorageConfig::Local {
            path: args.out.clone(),
        },
    ))
    .await
    .map_err(report)?;
    let mut driver = Driver::new(store, DriverConfig::default());
    let parquet = driver.add_sink(sink)?;
    let restored = driver.start().await.map_err(report)?;
    match restored.checkpoint {
        Some(id) => println!("resuming after durable checkpoint {id}"),
        None => println!("fresh start: no checkpoint in {}", args.state.display()),
    }

    let kafka = KafkaConnection::plaintext(&args.bootstrap);
    // One batch per checkpoint: at most `checkpoint_every` records.
    let options = KafkaSourceOptions {
        batch_rows: args.checkpoint_every,
        ..KafkaSourceOptions::default()
    };
    let mut source = KafkaSource::open_with(&kafka, &topic, &restored.positions, options)?;
    let end = source.high_watermarks()?;
    while !source.reached(&end) {
        let Some(batch) = source.next_batch(IDLE).await? else {
            continue;
        };
        driver.write(parquet, &batch).await.map_err(report)?;
        let id = driver
            .checkpoint(source.positions())
            .await
            .map_err(report)?;
        println!(
            "checkpoint {id}: {} records, decided (commit runs while the next checkpoint is written)",
            batch.num_rows()
        );
    }

    driver.close().await.map_err(report)?;

    let summary = summarize(&args.out)?;
    println!("\nvisible files in {}:", args.out.display());
    for (name, rows) in &summary.files {
        println!("  {name:<50} {rows:>8} rows");
    }
    println!(
        "total: {} rows, {} distinct source records, {} duplicates",
        summary.rows,
        summary.distinct.len(),
        summary.duplicates()
    );
    anyhow::ensure!(
        summary.duplicates() == 0,
        "duplicates found: exactly-once violated"
    );
    Ok(())
}

fn report(e: connector_api::Error) -> anyhow::Error {
    anyhow::anyhow!("{}", Report(&e))
}

async fn create_topic(bootstrap: &str, topic: &str, partitions: i32) -> Result<()> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .context("cannot create Kafka admin client")?;
    let results = admin
        .create_topics(
            &[NewTopic::new(topic, partitions, TopicReplication::Fixed(1))],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
        )
        .await
        .with_context(|| {
            format!("cannot reach Kafka at {bootstrap}: is it up? (scripts/services.sh up kafka)")
        })?;
    for result in results {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((name, code)) => anyhow::bail!("cannot create topic {name}: {code}"),
        }
    }
    Ok(())
}

async fn produce(bootstrap: &str, topic: &str, records: u64) -> Result<()> {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .create()
        .context("cannot create Kafka producer")?;
    let mut pending = std::collections::VecDeque::new();
    for i in 0..records {
        let key = format!("order-{i}");
        let value = format!(
            r#"{{"order_id":{i},"amount_cents":{}}}"#,
            (i * 7919) % 100_000
        );
        loop {
            match producer.send_result(FutureRecord::to(topic).key(&key).payload(&value)) {
                Ok(delivery) => {
                    pending.push_back((i, delivery));
                    break;
                }
                // The local queue is full: wait for the oldest delivery, then enqueue again.
                Err((e, _)) if e.rdkafka_error_code() == Some(RDKafkaErrorCode::QueueFull) => {
                    let Some(oldest) = pending.pop_front() else {
                        anyhow::bail!("producer queue full with nothing in flight: {e}");
                    };
                    await_delivery(oldest).await?;
                }
                Err((e, _)) => anyhow::bail!("cannot enqueue record {i}: {e}"),
            }
        }
    }
    for delivery in pending {
        await_delivery(delivery).await?;
    }
    Ok(())
}

async fn await_delivery((i, delivery): (u64, rdkafka::producer::DeliveryFuture)) -> Result<()> {
    delivery
        .await
        .context("producer dropped")?
        .map_err(|(e, _)| anyhow::anyhow!("record {i} was not delivered: {e}"))?;
    Ok(())
}
