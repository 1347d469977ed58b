//! Asking the log itself whether a transaction committed: a read_committed consumer returns a transaction's
//! records only if it committed. Used when the coordinator can no longer tell (the transactional id has moved on
//! to a newer epoch since, e.g. after recovery re-initialised it, or expired).
//!
//! The answer is about this transaction's own records only: offsets are unique within a partition, so the record
//! at `first_offset` (the transaction's first delivered record there) is ours, and it is visible to a
//! read_committed reader if and only if our transaction committed. Records of other producers inside the range
//! (another subtask on a shared partition, another application) say nothing, whatever became of them.

use std::time::{Duration, Instant};

use connector_api::{Error, ErrorKind, Phase, Result};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};

use crate::sink::PartitionRange;

/// How long to wait for the log to answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(30);

/// Whether the transaction that wrote `range` (its records from `first_offset`) is visible to read_committed
/// readers.
///
/// # Errors
/// [`Retryable`](ErrorKind::Retryable) when the answer does not come in time (for instance while the transaction
/// is still open and holds the last stable offset below `range`).
pub(crate) async fn visible_in_log(
    connection: &ClientConfig,
    range: &PartitionRange,
) -> Result<bool> {
    let connection = connection.clone();
    let range = range.clone();
    tokio::task::spawn_blocking(move || probe(&connection, &range))
        .await
        .expect("probe task panicked")
}

/// What one poll of a read_committed consumer positioned at a transaction's first offset showed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    /// A record at this offset.
    Record(i64),
    /// No record; the consumer's position is now this offset.
    Position(i64),
    /// No record and no position yet.
    Nothing,
}

/// Whether our transaction, whose first record in the partition is at `first`, committed, from what the consumer
/// showed; `None` while it cannot tell yet.
///
/// - The first record returned at or after `first` *is* ours exactly when it sits at `first`: read_committed
///   returns it only if our transaction committed. A record at a later offset means ours was skipped (aborted),
///   whatever producer wrote the later one.
/// - Without a record, a position past `first` means the consumer skipped it (aborted records and control markers
///   are skipped silently).
fn verdict(first: i64, seen: Seen) -> Option<bool> {
    match seen {
        Seen::Record(offset) if offset == first => Some(true),
        Seen::Record(offset) if offset > first => Some(false),
        Seen::Position(position) if position > first => Some(false),
        _ => None,
    }
}

fn probe(connection: &ClientConfig, range: &PartitionRange) -> Result<bool> {
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
    let consumer: BaseConsumer = connection
        .clone()
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
        let seen = match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(message)) => Seen::Record(message.offset()),
            Some(Err(e)) => return Err(failed("the probe consumer failed", e)),
            None => {
                let position = consumer
                    .position()
                    .map_err(|e| failed("cannot read the probe position", e))?;
                match position.elements().first().map(|e| e.offset()) {
                    Some(Offset::Offset(o)) => Seen::Position(o),
                    _ => Seen::Nothing,
                }
            }
        };
        if let Some(committed) = verdict(range.first_offset, seen) {
            return Ok(committed);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_our_own_first_record_says_committed() {
        // Ours committed: the record at our first offset comes back.
        assert_eq!(verdict(10, Seen::Record(10)), Some(true));
        // Ours aborted, another producer's committed record inside our range comes back: not ours.
        assert_eq!(verdict(10, Seen::Record(11)), Some(false));
        assert_eq!(verdict(10, Seen::Record(500)), Some(false));
        // Nothing returned, but the consumer moved past our first offset: skipped as aborted.
        assert_eq!(verdict(10, Seen::Position(11)), Some(false));
        // Not yet known (still fetching, or held below the last stable offset by an open transaction).
        assert_eq!(verdict(10, Seen::Position(10)), None);
        assert_eq!(verdict(10, Seen::Nothing), None);
    }
}
