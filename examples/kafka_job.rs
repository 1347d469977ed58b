//! A tokio job that embeds Ratchet: it reads a Kafka topic (read_committed, from checkpointed positions) and
//! writes every record exactly once to local Parquet files and to a second Kafka topic, checkpointing on its own
//! timer. Kill it at any moment and run it again: nothing is lost, nothing is written twice.
//!
//! ```sh
//! scripts/services.sh up kafka
//! cargo run -p ratchet-examples --example kafka_job -- 127.0.0.1:19092 orders /tmp/orders-job
//! ```
#![allow(clippy::disallowed_methods)] // tests, benches and examples read the services' endpoints and their modes from the environment

use std::path::PathBuf;
use std::time::{Duration, Instant};

use connector_api::{Driver, DriverConfig, LocalCheckpointStore, Report, SinkId, SubtaskId};
use file_sink::{FileSink, FileSinkConfig, StorageConfig};
use kafka_sink::{KafkaSink, KafkaSinkConfig};
use kafka_source::{KafkaConnection, KafkaSource, text_schema};

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let bootstrap = args.next().unwrap_or_else(|| "127.0.0.1:19092".into());
    let topic = args.next().unwrap_or_else(|| "orders".into());
    let dir = PathBuf::from(
        args.next()
            .unwrap_or_else(|| "/tmp/ratchet-kafka-job".into()),
    );
    if let Err(e) = run(&bootstrap, &topic, &dir).await {
        eprintln!("kafka_job failed: {}", Report(&e));
        std::process::exit(1);
    }
}

async fn run(bootstrap: &str, topic: &str, dir: &std::path::Path) -> connector_api::Result<()> {
    let checkpoint_interval = Duration::from_secs(1);
    let config = DriverConfig {
        checkpoint_interval,
        ..DriverConfig::default()
    };
    let mut driver = Driver::new(LocalCheckpointStore::open(dir.join("state"), 5)?, config);
    let files = driver.add_sink(
        FileSink::new(FileSinkConfig::new(
            SinkId::new("parquet")?,
            SubtaskId(0),
            text_schema(),
            StorageConfig::Local {
                path: dir.join("out"),
            },
        ))
        .await?,
    )?;
    let copy = driver.add_sink(KafkaSink::new(
        KafkaSinkConfig::new(bootstrap, format!("{topic}-copy"), format!("{topic}-copy")),
        SinkId::new("copy")?,
        SubtaskId(0),
    )?)?;

    let restored = driver.start().await?;
    let kafka = KafkaConnection::plaintext(bootstrap);
    let mut source = KafkaSource::open(&kafka, topic, &restored.positions).await?;
    let end = source.watermarks()?;
    // The job's own checkpoint timer.
    let mut last_checkpoint = Instant::now();
    while !source.reached(&end) {
        if let Some(batch) = source.next_batch(Duration::from_millis(100)).await? {
            driver.write(files, &batch).await?;
            driver.write(copy, &batch).await?;
        }
        if last_checkpoint.elapsed() >= checkpoint_interval {
            let id = driver.checkpoint(source.positions()).await?;
            println!("checkpoint {id} decided at {:?}", source.positions());
            last_checkpoint = Instant::now();
        }
    }
    driver.checkpoint(source.positions()).await?;
    driver.close().await
}
