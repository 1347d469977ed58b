//! The checkpoint record and its on-disk encoding (a checksummed, versioned JSON document).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{CheckpointId, SinkId};

/// Where to resume one source partition: the offset of the next record to read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceOffset {
    /// Source topic.
    pub topic: String,
    /// Source partition.
    pub partition: i32,
    /// The next offset to read (last processed offset + 1).
    pub next_offset: i64,
    /// The topic's id in the source system, when it has one (Kafka's topic id, as its tools print it): a topic
    /// deleted and created again under the same name gets a new one, and the offsets saved for the old topic
    /// mean nothing there. Absent in records written before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic_id: Option<String>,
}

impl SourceOffset {
    /// The position `next_offset` in `topic`'s `partition`, without a topic id.
    pub fn new(topic: impl Into<String>, partition: i32, next_offset: i64) -> Self {
        Self {
            topic: topic.into(),
            partition,
            next_offset,
            topic_id: None,
        }
    }
}

/// One durable checkpoint: the commit decision for every sink's transaction of checkpoint `id`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointRecord {
    /// The checkpoint this record decides.
    pub id: CheckpointId,
    /// Source positions covered by the checkpoint: a restart resumes reading here.
    pub positions: Vec<SourceOffset>,
    /// Each sink's committables, serialized by the sink (see `TwoPhaseCommit::Committable`).
    pub committables: BTreeMap<SinkId, serde_json::Value>,
}

/// Version of the encoding written by this release. Readers accept every version up to this one.
pub(crate) const FORMAT_VERSION: u32 = 1;

#[derive(Serialize, Deserialize)]
struct Envelope {
    format: String,
    version: u32,
    crc32: u32,
    record: serde_json::Value,
}

const FORMAT_NAME: &str = "ratchet-checkpoint";

impl CheckpointRecord {
    /// Encodes the record with a format tag, version and CRC-32 of the record's canonical JSON: the bytes a
    /// [`CheckpointStore`](super::CheckpointStore) keeps.
    pub fn encode(&self) -> Vec<u8> {
        let record = serde_json::to_value(self).expect("checkpoint record serializes");
        let crc32 = crc32fast::hash(record.to_string().as_bytes());
        let envelope = Envelope {
            format: FORMAT_NAME.into(),
            version: FORMAT_VERSION,
            crc32,
            record,
        };
        serde_json::to_vec_pretty(&envelope).expect("envelope serializes")
    }

    /// Decodes and verifies a record; the error says what is wrong with it.
    pub(crate) fn decode(bytes: &[u8]) -> Result<Self, String> {
        let envelope: Envelope = serde_json::from_slice(bytes).map_err(|e| {
            format!("not a complete checkpoint document (truncated or damaged): {e}")
        })?;
        if envelope.format != FORMAT_NAME {
            return Err(format!("unknown format {:?}", envelope.format));
        }
        if envelope.version > FORMAT_VERSION {
            return Err(format!(
                "written by a newer release (format version {}, this release reads up to {FORMAT_VERSION})",
                envelope.version
            ));
        }
        let actual = crc32fast::hash(envelope.record.to_string().as_bytes());
        if actual != envelope.crc32 {
            return Err(format!(
                "checksum mismatch (stored {:08x}, computed {actual:08x})",
                envelope.crc32
            ));
        }
        serde_json::from_value(envelope.record).map_err(|e| format!("invalid record: {e}"))
    }
}

/// Picks the newest intact record among `candidates` (id, where it is stored, encoded bytes), newest first.
///
/// A damaged record (undecodable, bad checksum, holding another id) is skipped with an error log naming it; if
/// every candidate is damaged the store refuses to start fresh, since that would replay the source from the
/// beginning and duplicate everything. Every [`CheckpointStore`](super::CheckpointStore) loads through it.
///
/// # Errors
/// [`Fatal`](crate::ErrorKind::Fatal) naming each damaged record when no candidate is intact.
pub fn newest_intact(
    store: &str,
    candidates: impl IntoIterator<Item = (CheckpointId, String, Vec<u8>)>,
) -> crate::Result<Option<CheckpointRecord>> {
    let mut damaged = Vec::new();
    for (id, location, bytes) in candidates {
        match CheckpointRecord::decode(&bytes) {
            Ok(record) if record.id == id => {
                if !damaged.is_empty() {
                    tracing::error!(damaged = ?damaged, using = %location,
                        "refused damaged checkpoint record(s); resuming from the previous intact one");
                }
                return Ok(Some(record));
            }
            Ok(record) => damaged.push(format!(
                "{location}: holds checkpoint {} instead of {id}",
                record.id
            )),
            Err(reason) => damaged.push(format!("{location}: {reason}")),
        }
    }
    if damaged.is_empty() {
        return Ok(None);
    }
    Err(crate::Error::new(
        crate::ErrorKind::Fatal,
        crate::Phase::Checkpoint,
        format!(
            "every checkpoint record in {store} is damaged ({}); restore one from backup, or delete them to start \
             the job from scratch (replaying the source from the beginning)",
            damaged.join("; ")
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> CheckpointRecord {
        CheckpointRecord {
            id: CheckpointId(3),
            positions: vec![SourceOffset::new("orders", 0, 42)],
            committables: BTreeMap::from([(
                SinkId::new("files").unwrap(),
                serde_json::json!([{"path": "a"}]),
            )]),
        }
    }

    #[test]
    fn round_trips() {
        let record = sample();
        assert_eq!(CheckpointRecord::decode(&record.encode()).unwrap(), record);
    }

    #[test]
    fn refuses_truncated_and_tampered_records() {
        let bytes = sample().encode();
        let truncated = CheckpointRecord::decode(&bytes[..bytes.len() / 2]).unwrap_err();
        assert!(truncated.contains("truncated"), "{truncated}");

        let tampered = String::from_utf8(bytes).unwrap().replace("42", "43");
        let err = CheckpointRecord::decode(tampered.as_bytes()).unwrap_err();
        assert!(err.contains("checksum mismatch"), "{err}");
    }

    #[test]
    fn refuses_a_newer_format() {
        let bytes = String::from_utf8(sample().encode())
            .unwrap()
            .replace("\"version\": 1", "\"version\": 99");
        let err = CheckpointRecord::decode(bytes.as_bytes()).unwrap_err();
        assert!(err.contains("newer release"), "{err}");
    }
}
