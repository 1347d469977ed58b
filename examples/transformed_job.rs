//! A tokio job that embeds Ratchet with a transform between its source and its sink: it reads a Kafka topic of
//! JSON orders as text, keeps the paid ones and masks the customer's email (SQL over each batch, planned once by
//! [`transform::Transform::sql`]), and writes the result exactly once to local Parquet files. A transform is a
//! function of the batch, so a replay after a crash writes the same rows: kill it at any moment and run it again.
//! A record the transform cannot take (its `amount` is not a number) is named with its partition and offset and
//! stops the job; the worker's dead-letter topic does the same through `[dead_letter]`.
//!
//! ```sh
//! scripts/services.sh up kafka
//! cargo run -p ratchet-examples --example transformed_job -- 127.0.0.1:19092 orders /tmp/orders-masked
//! ```
#![allow(clippy::disallowed_methods)] // tests, benches and examples read the services' endpoints and their modes from the environment

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::cast::AsArray;
use arrow_array::types::{Int32Type, Int64Type};
use connector_api::{
    Driver, DriverConfig, Error, ErrorKind, LocalCheckpointStore, Phase, Report, SinkId, SubtaskId,
};
use file_sink::{FileSink, FileSinkConfig, StorageConfig};
use kafka_source::{KafkaConnection, KafkaSource, text_schema};
use transform::{Pipeline, Transform};

/// The text decoding's `value` is the JSON document; the functions of datafusion-functions-json read it.
const MASK: &str = "
    SELECT partition, \"offset\",
           json_get_int(value, 'id') AS id,
           encode(sha256(json_get_str(value, 'email')), 'hex') AS email_hash,
           CAST(json_get_str(value, 'amount') AS DECIMAL(12, 2)) AS amount
    FROM input
    WHERE json_get_bool(value, 'paid')";

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let bootstrap = args.next().unwrap_or_else(|| "127.0.0.1:19092".into());
    let topic = args.next().unwrap_or_else(|| "orders".into());
    let dir = PathBuf::from(
        args.next()
            .unwrap_or_else(|| "/tmp/ratchet-transformed-job".into()),
    );
    if let Err(e) = run(&bootstrap, &topic, &dir).await {
        eprintln!("transformed_job failed: {}", Report(&e));
        std::process::exit(1);
    }
}

async fn run(bootstrap: &str, topic: &str, dir: &std::path::Path) -> connector_api::Result<()> {
    // Planned and checked once, before anything is written: a non-deterministic or stateful query is refused here.
    let mask = Arc::new(Transform::sql("mask", MASK, text_schema())?);
    let pipeline = Pipeline::new(text_schema(), vec![mask.clone()])?;
    let checkpoint_interval = Duration::from_secs(1);
    let config = DriverConfig {
        checkpoint_interval,
        ..DriverConfig::default()
    };
    let mut driver = Driver::new(LocalCheckpointStore::open(dir.join("state"), 5)?, config);
    // The sink is built for what the transform gives, not for what the source reads.
    let files = driver.add_sink(
        FileSink::new(FileSinkConfig::new(
            SinkId::new("masked")?,
            SubtaskId(0),
            mask.output_schema().clone(),
            StorageConfig::Local {
                path: dir.join("out"),
            },
        ))
        .await?,
    )?;

    let restored = driver.start().await?;
    let kafka = KafkaConnection::plaintext(bootstrap);
    let mut source = KafkaSource::open(&kafka, topic, &restored.positions).await?;
    let end = source.watermarks()?;
    let mut last_checkpoint = Instant::now();
    while !source.reached(&end) {
        if let Some(batch) = source.next_batch(Duration::from_millis(100)).await? {
            let shaped = pipeline.apply_isolating(&batch);
            if let Some(failed) = shaped.failures.first() {
                let partition = batch
                    .column(1)
                    .as_primitive::<Int32Type>()
                    .value(failed.row);
                let offset = batch
                    .column(2)
                    .as_primitive::<Int64Type>()
                    .value(failed.row);
                return Err(Error::new(
                    ErrorKind::BadRecord,
                    Phase::Write,
                    format!(
                        "the record at {topic}/{partition}@{offset}: {}",
                        failed.failure
                    ),
                ));
            }
            driver.write(files, &shaped.rows).await?;
        }
        if last_checkpoint.elapsed() >= checkpoint_interval {
            driver.checkpoint(source.positions()).await?;
            last_checkpoint = Instant::now();
        }
    }
    driver.checkpoint(source.positions()).await?;
    driver.close().await
}
