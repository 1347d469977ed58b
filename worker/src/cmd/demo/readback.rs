//! Reading the demo's four sinks back, each with its own client, and comparing the ids with the input.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use arrow_array::{Array, Int64Array, RecordBatch};
use futures_util::TryStreamExt;
use iceberg::TableIdent;
use iceberg_sink::{CatalogConfig, S3Settings};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};

use super::job::Names;
use crate::cli::DemoArgs;

/// What one sink holds, against the input ids `0..records`.
pub struct Verdict {
    /// The sink's kind.
    pub sink: &'static str,
    /// Where its output is.
    pub place: String,
    /// Rows or records read.
    pub rows: usize,
    /// Distinct ids among them.
    pub distinct: usize,
    /// Input ids not found.
    pub missing: u64,
    /// Rows beyond the first of each id.
    pub duplicates: usize,
}

impl Verdict {
    fn of(sink: &'static str, place: String, ids: &[i64], records: u64) -> Self {
        let mut counts: BTreeMap<i64, usize> = BTreeMap::new();
        for id in ids {
            *counts.entry(*id).or_default() += 1;
        }
        let present = counts
            .keys()
            .filter(|id| (0..records as i64).contains(id))
            .count() as u64;
        Self {
            sink,
            place,
            rows: ids.len(),
            distinct: counts.len(),
            missing: records - present,
            duplicates: ids.len() - counts.len(),
        }
    }
}

/// Checks that PostgreSQL answers at `url`, naming the command that starts it otherwise.
///
/// # Errors
/// It does not.
pub async fn check_postgres(url: &str) -> Result<()> {
    let options = connector_common::postgres::PgConnectOptions::parse(url).context("--pg-url")?;
    tokio::time::timeout(Duration::from_secs(10), options.connect("PostgreSQL"))
        .await
        .map_err(|_| anyhow::anyhow!("PostgreSQL did not answer within 10 s"))?
        .context("is PostgreSQL up? (scripts/services.sh up postgres)")?;
    Ok(())
}

/// Reads every sink of the demo job.
///
/// # Errors
/// A sink that cannot be read.
pub async fn read_all(dir: &Path, args: &DemoArgs, names: &Names) -> Result<Vec<Verdict>> {
    let records = args.records;
    let files = dir.join("files");
    Ok(vec![
        Verdict::of(
            "files",
            files.display().to_string(),
            &parquet_ids(&files)?,
            records,
        ),
        Verdict::of(
            "iceberg",
            names.iceberg_table.clone(),
            &iceberg_ids(dir, &names.iceberg_table).await?,
            records,
        ),
        Verdict::of(
            "postgres",
            names.pg_table.clone(),
            &postgres_ids(&args.pg_url, &names.pg_table).await?,
            records,
        ),
        Verdict::of(
            "kafka",
            names.copy_topic.clone(),
            &kafka_ids(&args.bootstrap, &names.copy_topic)?,
            records,
        ),
    ])
}

fn ids_of(batch: &RecordBatch, what: &str) -> Result<Vec<i64>> {
    let ids = batch
        .column_by_name("id")
        .and_then(|c| c.as_any().downcast_ref::<Int64Array>())
        .with_context(|| format!("{what} has no int64 id column"))?;
    Ok((0..ids.len()).map(|i| ids.value(i)).collect())
}

/// The ids in every visible Parquet file (not dot-prefixed) of `dir`.
fn parquet_ids(dir: &Path) -> Result<Vec<i64>> {
    let mut ids = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let path = entry?.path();
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if name.starts_with('.') || !name.ends_with(".parquet") {
            continue;
        }
        let reader = ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(&path)?)
            .with_context(|| format!("cannot read {}", path.display()))?
            .build()?;
        for batch in reader {
            ids.extend(ids_of(&batch?, &path.display().to_string())?);
        }
    }
    Ok(ids)
}

/// The ids in the Iceberg table's current snapshot, scanned with iceberg-rust.
async fn iceberg_ids(dir: &Path, table: &str) -> Result<Vec<i64>> {
    let catalog = CatalogConfig::Sql {
        uri: format!("sqlite://{}/catalog.db?mode=rwc", dir.display()),
        warehouse: format!("file://{}/warehouse", dir.display()),
    }
    .open("ratchet", &S3Settings::default())
    .await
    .map_err(anyhow::Error::from)?;
    let ident = TableIdent::from_strs(table.split('.'))?;
    let table = catalog.load_table(&ident).await?;
    let batches: Vec<RecordBatch> = table
        .scan()
        .select(["id"])
        .build()?
        .to_arrow()
        .await?
        .try_collect()
        .await?;
    let mut ids = Vec::new();
    for batch in &batches {
        ids.extend(ids_of(batch, "the Iceberg table")?);
    }
    Ok(ids)
}

/// The ids in the PostgreSQL table.
async fn postgres_ids(url: &str, table: &str) -> Result<Vec<i64>> {
    let client = connector_common::postgres::PgConnectOptions::parse(url)?
        .connect("PostgreSQL")
        .await?;
    let rows = client
        .query(&format!("SELECT id FROM \"{table}\""), &[])
        .await
        .with_context(|| format!("cannot read table {table}"))?;
    Ok(rows.iter().map(|row| row.get::<_, i64>(0)).collect())
}

/// The ids in the values of every record a read_committed consumer sees in `topic`, up to its end.
fn kafka_ids(bootstrap: &str, topic: &str) -> Result<Vec<i64>> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "ratchet-demo-readback")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .create()?;
    let timeout = Duration::from_secs(30);
    let metadata = consumer.fetch_metadata(Some(topic), timeout)?;
    let mut assignment = TopicPartitionList::new();
    let mut ends = BTreeMap::new();
    for partition in metadata.topics().iter().flat_map(|t| t.partitions()) {
        let (_, high) = consumer.fetch_watermarks(topic, partition.id(), timeout)?;
        assignment.add_partition_offset(topic, partition.id(), Offset::Beginning)?;
        ends.insert(partition.id(), high);
    }
    consumer.assign(&assignment)?;
    let mut ids = Vec::new();
    let mut positions: BTreeMap<i32, i64> = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    // Transaction markers take offsets too: done when the consumer's position reaches the high watermark.
    while ends.iter().any(|(p, end)| {
        consumer
            .position()
            .ok()
            .and_then(|tpl| tpl.find_partition(topic, *p).map(|e| e.offset()))
            .and_then(|o| o.to_raw())
            .unwrap_or(0)
            < *end
    }) {
        if Instant::now() > deadline {
            bail!(
                "could not read {topic} to its end within 60 s (an open transaction holds it back?)"
            );
        }
        let Some(message) = consumer.poll(Duration::from_millis(500)) else {
            continue;
        };
        let message = message?;
        positions.insert(message.partition(), message.offset() + 1);
        let value: serde_json::Value =
            serde_json::from_slice(message.payload().unwrap_or_default()).with_context(|| {
                format!(
                    "record {topic}/{}@{} is not JSON",
                    message.partition(),
                    message.offset()
                )
            })?;
        ids.push(value["id"].as_i64().with_context(|| {
            format!(
                "record {topic}/{}@{} has no id",
                message.partition(),
                message.offset()
            )
        })?);
    }
    Ok(ids)
}
