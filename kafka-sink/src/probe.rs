//! Asking the log itself whether a transaction committed: a read_committed consumer returns a transaction's
//! records only if it committed. Used when the coordinator can no longer tell (the transactional id has moved on
//! to a newer epoch since, e.g. after recovery re-initialised it).

use std::time::{Duration, Instant};

use connector_api::{Error, ErrorKind, Phase, Result};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};

use crate::sink::PartitionRange;

/// How long to wait for the log to answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(30);

/// Whether the records of `range` are visible to read_committed readers.
///
/// # Errors
/// [`Retryable`](ErrorKind::Retryable) when the answer does not come in time (for instance while the transaction
/// is still open and holds the last stable offset below `range`).
pub(crate) async fn visible_in_log(bootstrap: &str, range: &PartitionRange) -> Result<bool> {
    let bootstrap = bootstrap.to_string();
    let range = range.clone();
    tokio::task::spawn_blocking(move || probe(&bootstrap, &range))
        .await
        .expect("probe task panicked")
}

fn probe(bootstrap: &str, range: &PartitionRange) -> Result<bool> {
    let where_ = format!(
        "{}/{} offsets {}..={}",
        range.topic, range.partition, range.first_offset, range.last_offset
    );
    let failed = |message: &str, e: rdkafka::error::KafkaError| {
        Error::new(
            ErrorKind::Retryable,
            Phase::Commit,
            format!("{message} ({where_})"),
        )
        .with_source(e)
    };
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "ratchet-commit-probe")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("isolation.level", "read_committed")
        .create()
        .map_err(|e| failed("cannot create the probe consumer", e))?;
    let mut assignment = TopicPartitionList::new();
    assignment
        .add_partition_offset(
            &range.topic,
            range.partition,
            Offset::Offset(range.first_offset),
        )
        .map_err(|e| failed("cannot assign the probe consumer", e))?;
    consumer
        .assign(&assignment)
        .map_err(|e| failed("cannot assign the probe consumer", e))?;
    let deadline = Instant::now() + PROBE_TIMEOUT;
    while Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(message)) => return Ok(message.offset() <= range.last_offset),
            Some(Err(e)) => return Err(failed("the probe consumer failed", e)),
            None => {
                // read_committed skips aborted records and control markers without returning anything; once the
                // position is past the range, nothing of it was committed.
                let position = consumer
                    .position()
                    .map_err(|e| failed("cannot read the probe position", e))?;
                let past = position.elements().iter().any(|e| match e.offset() {
                    Offset::Offset(o) => o > range.last_offset,
                    _ => false,
                });
                if past {
                    return Ok(false);
                }
            }
        }
    }
    Err(Error::new(
        ErrorKind::Retryable,
        Phase::Commit,
        format!(
            "the log did not say within {PROBE_TIMEOUT:?} whether {where_} committed (is a transaction still open?)"
        ),
    ))
}
