//! What the Kafka sinks store in a checkpoint record (format version 1): the persisted types, and a golden-file
//! test that this release still reads what it wrote (`testdata/committable-v1.json`).

use connector_api::CheckpointId;
use serde::{Deserialize, Serialize};

/// The offsets one partition received in a transaction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionRange {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// First offset written.
    pub first_offset: i64,
    /// Last offset written.
    pub last_offset: i64,
}

/// A pre-committed Kafka transaction: the transactional id and the producer id and epoch that own it, which is all
/// EndTxn needs to commit it from another process, and the offsets it wrote (named when it is lost).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KafkaCommittable {
    /// The checkpoint.
    pub checkpoint: CheckpointId,
    /// The transactional id.
    pub transactional_id: String,
    /// The producer id owning it.
    pub producer_id: i64,
    /// The producer epoch of the transaction.
    pub producer_epoch: i16,
    /// What the transaction wrote (empty: an empty transaction, nothing to commit on the broker).
    pub ranges: Vec<PartitionRange>,
}

/// What one at-least-once checkpoint wrote: already visible, nothing to commit. Kept in the checkpoint record
/// for operators.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlushedRecords {
    /// The checkpoint.
    pub checkpoint: CheckpointId,
    /// The offsets written, per partition.
    pub ranges: Vec<PartitionRange>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Serialize, Deserialize)]
    struct Golden {
        exactly_once: Vec<KafkaCommittable>,
        at_least_once: Vec<FlushedRecords>,
    }

    /// What this release writes, format version 1, kept as a file: if a change to the persisted types makes this
    /// fail, raise the sink's `committable_version`, teach its `decode_committable` to read version 1, and add the
    /// new version's golden file beside this one (checkpoints written by older releases must stay readable).
    const V1: &str = include_str!("../testdata/committable-v1.json");

    #[test]
    fn format_version_1_still_reads_and_writes_back_the_same() {
        let golden: Golden = serde_json::from_str(V1).unwrap();
        assert_eq!(
            serde_json::to_value(&golden).unwrap(),
            serde_json::from_str::<serde_json::Value>(V1).unwrap()
        );
        let first = &golden.exactly_once[0];
        assert_eq!(first.checkpoint, CheckpointId(7));
        assert_eq!((first.producer_id, first.producer_epoch), (4001, 3));
        assert_eq!(first.ranges[1].last_offset, 41);
        assert!(golden.exactly_once[1].ranges.is_empty());
        assert_eq!(golden.at_least_once[0].ranges[0].partition, 1);
    }
}
