//! Asking the log itself whether a transaction committed: a read_committed consumer returns a transaction's
//! records only if it committed. Used when the coordinator can no longer tell (the transactional id has moved on
//! to a newer epoch since, e.g. after recovery re-initialised it, or expired).
//!
//! The answer is about this transaction's own records only: offsets are unique within a partition, so the records
//! at `first_offset` and `last_offset` of each recorded range (the transaction's first and last delivered records
//! there) are ours, and each is visible to a read_committed reader if and only if our transaction committed.
//! Records of other producers inside the range (another subtask on a shared partition, another application) say
//! nothing, whatever became of them. A record that read_committed skips is either aborted or no longer in the log;
//! a read_uncommitted read at the same offset tells the two apart (an aborted record is still there). A
//! transaction is atomic, so the first of our records found in the log decides for all of them.
//!
//! Records do leave the log: DeleteRecords and retention move the log start past them (a fetch there is out of
//! range), compaction takes them out of the middle (a read there goes on to a later record). Every probe consumer
//! runs with `auto.offset.reset=error`, so an offset that is gone is reported as such instead of silently jumping
//! to the log end, where another producer's record would read as "ours was skipped". When none of the records that
//! would tell is left, the log cannot decide: [`InLog::Gone`], which the sink reports in doubt, never as aborted.

use std::time::{Duration, Instant};

use connector_api::{Error, ErrorKind, Phase, Result};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};

use crate::committable::PartitionRange;

/// How long to wait for the log to answer one read.
const PROBE_TIMEOUT: Duration = Duration::from_secs(30);

/// How long to wait for a partition's log start offset (only named in a message, best effort).
const LOG_START_TIMEOUT: Duration = Duration::from_secs(10);

/// What the log says about a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum InLog {
    /// One of its records is visible to read_committed readers: it committed.
    Committed,
    /// One of its records is in the log but invisible to read_committed readers: it aborted.
    Aborted,
    /// None of the records that would tell is in the log any more (DeleteRecords, retention, compaction): the
    /// outcome cannot be decided from the log.
    Gone(Vec<Removed>),
}

/// A range whose records that would tell were removed from the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Removed {
    /// The recorded range.
    pub(crate) range: PartitionRange,
    /// The partition's log start offset now, if the broker said.
    pub(crate) log_start: Option<i64>,
}

/// What the log says about the transaction that wrote `ranges` (each read from its first and its last offset).
///
/// # Errors
/// [`Retryable`](ErrorKind::Retryable) when an answer does not come in time (for instance while the transaction
/// is still open and holds the last stable offset below a range) or a probe consumer fails.
pub(crate) async fn judge_in_log(
    connection: &ClientConfig,
    ranges: &[PartitionRange],
) -> Result<InLog> {
    let connection = connection.clone();
    let ranges = ranges.to_vec();
    connector_api::blocking(Phase::Commit, "the log probe", move || {
        judge(&connection, &ranges)
    })
    .await?
}

/// What one poll of a consumer positioned at one of our offsets showed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    /// A record at this offset.
    Record(i64),
    /// No record; the consumer's position is now this offset.
    Position(i64),
    /// No record and no position yet.
    Nothing,
    /// The offset is not in the log (below the log start: DeleteRecords or retention removed it); the consumer
    /// stopped (`auto.offset.reset=error`).
    OutOfRange,
}

/// What a read_committed read at one of our offsets says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Visibility {
    /// Our record came back: our transaction committed.
    Visible,
    /// The read went past our offset without returning it: aborted, or removed by compaction.
    Skipped,
    /// The offset is no longer in the log.
    OutOfRange,
}

/// Which records a probe consumer reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Isolation {
    /// Committed records only (`isolation.level=read_committed`).
    ReadCommitted,
    /// Every record still in the log (`isolation.level=read_uncommitted`).
    ReadUncommitted,
}

impl Isolation {
    fn level(self) -> &'static str {
        match self {
            Isolation::ReadCommitted => "read_committed",
            Isolation::ReadUncommitted => "read_uncommitted",
        }
    }
}

/// What a read_committed consumer positioned at our record at `offset` showed about it; `None` while it cannot
/// tell yet.
///
/// - The first record returned at or after `offset` *is* ours exactly when it sits at `offset`: read_committed
///   returns it only if our transaction committed. A record at a later offset means ours was skipped (aborted, or
///   compacted away), whatever producer wrote the later one.
/// - Without a record, a position past `offset` means the consumer skipped it (aborted records and control
///   markers are skipped silently).
/// - Out of range: the log no longer holds `offset` at all.
fn verdict(offset: i64, seen: Seen) -> Option<Visibility> {
    match seen {
        Seen::Record(o) if o == offset => Some(Visibility::Visible),
        Seen::Record(o) if o > offset => Some(Visibility::Skipped),
        Seen::Position(position) if position > offset => Some(Visibility::Skipped),
        Seen::OutOfRange => Some(Visibility::OutOfRange),
        _ => None,
    }
}

/// Whether our record at `offset` is still in the log, from what a read_uncommitted consumer positioned there
/// showed; `None` while it cannot tell yet. read_uncommitted skips nothing but control markers, so anything but
/// our record at `offset` means it is gone.
fn presence(offset: i64, seen: Seen) -> Option<bool> {
    match seen {
        Seen::Record(o) if o == offset => Some(true),
        Seen::Record(o) if o > offset => Some(false),
        Seen::Position(position) if position > offset => Some(false),
        Seen::OutOfRange => Some(false),
        _ => None,
    }
}

/// The offsets of our records read in `range`: its first and its last (once when they are the same).
fn ends(range: &PartitionRange) -> Vec<i64> {
    if range.first_offset == range.last_offset {
        vec![range.first_offset]
    } else {
        vec![range.first_offset, range.last_offset]
    }
}

/// The decision over every range, from the reads: `read_committed` at one of our offsets, `present` (a
/// read_uncommitted read there, only after read_committed skipped it) and `log_start` (for the message when
/// nothing is left). The first decisive answer wins.
fn judge_with(
    ranges: &[PartitionRange],
    mut read_committed: impl FnMut(&PartitionRange, i64) -> Result<Visibility>,
    mut present: impl FnMut(&PartitionRange, i64) -> Result<bool>,
    mut log_start: impl FnMut(&PartitionRange) -> Option<i64>,
) -> Result<InLog> {
    let mut removed = Vec::with_capacity(ranges.len());
    for range in ranges {
        for offset in ends(range) {
            match read_committed(range, offset)? {
                Visibility::Visible => return Ok(InLog::Committed),
                Visibility::OutOfRange => {}
                Visibility::Skipped => {
                    // Aborted if our record is still there; compacted away otherwise.
                    if present(range, offset)? {
                        return Ok(InLog::Aborted);
                    }
                }
            }
        }
        removed.push(Removed {
            range: range.clone(),
            log_start: log_start(range),
        });
    }
    Ok(InLog::Gone(removed))
}

fn judge(connection: &ClientConfig, ranges: &[PartitionRange]) -> Result<InLog> {
    judge_with(
        ranges,
        |range, offset| read_at(connection, range, offset, Isolation::ReadCommitted, verdict),
        |range, offset| {
            read_at(
                connection,
                range,
                offset,
                Isolation::ReadUncommitted,
                presence,
            )
        },
        |range| log_start(connection, range),
    )
}

/// Reads `range`'s partition from `offset` with `isolation` until `decide` answers from what the consumer showed.
fn read_at<T>(
    connection: &ClientConfig,
    range: &PartitionRange,
    offset: i64,
    isolation: Isolation,
    decide: fn(i64, Seen) -> Option<T>,
) -> Result<T> {
    let where_ = format!(
        "{}/{} offset {offset} of {}..={}, {}",
        range.topic,
        range.partition,
        range.first_offset,
        range.last_offset,
        isolation.level()
    );
    let failed = |message: &str, e: KafkaError| {
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
        // An offset no longer in the log is an answer, not a reason to read somewhere else.
        .set("auto.offset.reset", "error")
        .set("isolation.level", isolation.level())
        .create()
        .map_err(|e| failed("cannot create the probe consumer", e))?;
    let mut assignment = TopicPartitionList::new();
    assignment
        .add_partition_offset(&range.topic, range.partition, Offset::Offset(offset))
        .map_err(|e| failed("cannot assign the probe consumer", e))?;
    consumer
        .assign(&assignment)
        .map_err(|e| failed("cannot assign the probe consumer", e))?;
    let deadline = Instant::now() + PROBE_TIMEOUT;
    while Instant::now() < deadline {
        let seen = match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(message)) => Seen::Record(message.offset()),
            Some(Err(KafkaError::MessageConsumption(RDKafkaErrorCode::AutoOffsetReset))) => {
                Seen::OutOfRange
            }
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
        if let Some(answer) = decide(offset, seen) {
            return Ok(answer);
        }
    }
    let hint = match isolation {
        Isolation::ReadCommitted => " (is a transaction still open?)",
        Isolation::ReadUncommitted => "",
    };
    Err(Error::new(
        ErrorKind::Retryable,
        Phase::Commit,
        format!("the log did not answer within {PROBE_TIMEOUT:?} ({where_}){hint}"),
    ))
}

/// The log start offset of `range`'s partition now, if the broker says in time.
fn log_start(connection: &ClientConfig, range: &PartitionRange) -> Option<i64> {
    let consumer: BaseConsumer = connection.clone().create().ok()?;
    consumer
        .fetch_watermarks(&range.topic, range.partition, LOG_START_TIMEOUT)
        .ok()
        .map(|(low, _high)| low)
}

#[cfg(test)]
mod tests {
    use std::collections::{HashMap, HashSet};

    use super::*;

    #[test]
    fn only_our_own_records_say_committed() {
        // Ours committed: the record at our offset comes back.
        assert_eq!(verdict(10, Seen::Record(10)), Some(Visibility::Visible));
        // Ours aborted (or compacted away), another producer's committed record after it comes back: not ours.
        assert_eq!(verdict(10, Seen::Record(11)), Some(Visibility::Skipped));
        assert_eq!(verdict(10, Seen::Record(500)), Some(Visibility::Skipped));
        // Nothing returned, but the consumer moved past our offset: skipped.
        assert_eq!(verdict(10, Seen::Position(11)), Some(Visibility::Skipped));
        // Not in the log any more: neither committed nor aborted.
        assert_eq!(verdict(10, Seen::OutOfRange), Some(Visibility::OutOfRange));
        // Not yet known (still fetching, or held below the last stable offset by an open transaction).
        assert_eq!(verdict(10, Seen::Position(10)), None);
        assert_eq!(verdict(10, Seen::Nothing), None);
    }

    #[test]
    fn only_our_own_record_at_its_offset_is_present() {
        assert_eq!(presence(10, Seen::Record(10)), Some(true));
        // Compacted away: the read goes on to a later record, or past the offset.
        assert_eq!(presence(10, Seen::Record(11)), Some(false));
        assert_eq!(presence(10, Seen::Position(12)), Some(false));
        // Below the log start (DeleteRecords, retention).
        assert_eq!(presence(10, Seen::OutOfRange), Some(false));
        assert_eq!(presence(10, Seen::Position(10)), None);
        assert_eq!(presence(10, Seen::Nothing), None);
    }

    fn range(partition: i32, first_offset: i64, last_offset: i64) -> PartitionRange {
        PartitionRange {
            topic: "t".into(),
            partition,
            first_offset,
            last_offset,
        }
    }

    /// A log: what read_committed shows at (partition, offset) (out of range when not listed), and which of those
    /// skipped records are still there.
    struct Log {
        committed: HashMap<(i32, i64), Visibility>,
        present: HashSet<(i32, i64)>,
        reads: Vec<(i32, i64)>,
    }

    impl Log {
        fn new(committed: &[((i32, i64), Visibility)], present: &[(i32, i64)]) -> Self {
            Self {
                committed: committed.iter().copied().collect(),
                present: present.iter().copied().collect(),
                reads: Vec::new(),
            }
        }

        fn judge(&mut self, ranges: &[PartitionRange]) -> InLog {
            let committed = self.committed.clone();
            let present = self.present.clone();
            let reads = &mut self.reads;
            judge_with(
                ranges,
                |r, offset| {
                    reads.push((r.partition, offset));
                    Ok(committed
                        .get(&(r.partition, offset))
                        .copied()
                        .unwrap_or(Visibility::OutOfRange))
                },
                |r, offset| Ok(present.contains(&(r.partition, offset))),
                |r| Some(100 + i64::from(r.partition)),
            )
            .unwrap()
        }
    }

    #[test]
    fn the_last_record_decides_when_the_first_was_removed() {
        use Visibility::*;
        let ranges = [range(0, 10, 20)];
        assert_eq!(
            Log::new(&[((0, 20), Visible)], &[]).judge(&ranges),
            InLog::Committed
        );
        // Skipped by read_committed and still there: aborted.
        assert_eq!(
            Log::new(&[((0, 20), Skipped)], &[(0, 20)]).judge(&ranges),
            InLog::Aborted
        );
        // The first record compacted away (skipped, not there), the last one visible.
        assert_eq!(
            Log::new(&[((0, 10), Skipped), ((0, 20), Visible)], &[]).judge(&ranges),
            InLog::Committed
        );
    }

    #[test]
    fn gone_only_when_no_record_that_would_tell_is_left() {
        use Visibility::*;
        let ranges = [range(0, 10, 20), range(3, 5, 5)];
        let mut log = Log::new(&[((0, 10), Skipped)], &[]);
        assert_eq!(
            log.judge(&ranges),
            InLog::Gone(vec![
                Removed {
                    range: range(0, 10, 20),
                    log_start: Some(100),
                },
                Removed {
                    range: range(3, 5, 5),
                    log_start: Some(103),
                },
            ])
        );
        // Both ends of the first range, the single record of the second once.
        assert_eq!(log.reads, vec![(0, 10), (0, 20), (3, 5)]);
        // Any surviving record of any partition decides, in the order of the ranges.
        let mut log = Log::new(&[((3, 5), Visible)], &[]);
        assert_eq!(log.judge(&ranges), InLog::Committed);
        let mut log = Log::new(&[((0, 10), Skipped), ((3, 5), Visible)], &[(0, 10)]);
        assert_eq!(log.judge(&ranges), InLog::Aborted);
        assert_eq!(log.reads, vec![(0, 10)]);
    }
}
