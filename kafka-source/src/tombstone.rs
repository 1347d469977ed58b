//! Tombstones: records whose value is null, Kafka's way of saying "this key is deleted" (log compaction keeps the
//! last record per key; a tombstone removes the key). They are records, never errors: the raw decodings carry them
//! as rows with a null `value`; the JSON and Avro decodings, whose rows are the value's fields, hand them out beside
//! the batch ([`KafkaSource::take_tombstones`](crate::KafkaSource::take_tombstones)), for the sinks that can
//! express a deletion.

/// A record with a null value, read from the source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tombstone {
    /// Its topic.
    pub topic: String,
    /// Its partition.
    pub partition: i32,
    /// Its offset.
    pub offset: i64,
    /// The key it deletes (a tombstone without a key deletes nothing, but is still a record).
    pub key: Option<Vec<u8>>,
}
