//! What [`KafkaSource::next_event`](crate::KafkaSource::next_event) hands a job: a batch with everything that came
//! with it, or the reason there is none (nothing ready, a schema change or a new topic held back). One `match`
//! instead of asking the source after every batch.

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;

use crate::{Gap, RejectedRecord, Tombstone};

/// The next thing a job must act on.
#[derive(Debug)]
pub enum SourceEvent {
    /// Nothing was ready within the wait.
    Idle,
    /// A batch was handed out: the positions now cover it.
    Batch(SourceBatch),
    /// The next batch has this new schema (a registry-backed Avro decoding that widened its reader schema). It is
    /// held, and the positions cover only the batches before it: the job checkpoints them, makes its sinks take
    /// the new columns, then calls [`accept_schema_change`](crate::KafkaSource::accept_schema_change).
    SchemaChange(SchemaRef),
    /// The next batch is of this topic, outside [`limit_topics`](crate::KafkaSource::limit_topics). It is held,
    /// and the positions do not cover it: the job checkpoints what it read, prepares for the topic, and reopens
    /// the source.
    NewTopic(String),
}

/// A batch as the source hands it out.
#[derive(Debug)]
pub struct SourceBatch {
    /// The topic of its rows (a batch with no rows, one that only moves the positions past transaction markers or
    /// rejected records, keeps the previous batch's topic; empty before the first).
    pub topic: String,
    /// The decoded rows, all of [`topic`](Self::topic); possibly none.
    pub rows: RecordBatch,
    /// Records that did not decode (with `divert_bad_records`), for the dead-letter destination, oldest first.
    pub rejected: Vec<RejectedRecord>,
    /// Tombstones (a null value) that came after the rows, oldest first, for the sinks that can delete.
    pub tombstones: Vec<Tombstone>,
    /// Gaps skipped before the rows (with [`GapPolicy::Earliest`](crate::GapPolicy::Earliest)).
    pub gaps: Vec<Gap>,
}
