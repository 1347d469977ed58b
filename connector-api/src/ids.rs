//! Identifier newtypes. External transaction handles (file names, transactional ids, XA xids) are derived from
//! these deterministically, never at random, so a restarted worker can find and fence what it left behind.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The number of a checkpoint. Checkpoint ids only grow; the first checkpoint of a fresh job is 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct CheckpointId(pub u64);

impl CheckpointId {
    /// The checkpoint after this one.
    pub fn next(self) -> Self {
        Self(self.0 + 1)
    }
}

impl fmt::Display for CheckpointId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The stable name of one sink in a job. It scopes everything the sink owns in the external system (file prefixes,
/// transactional ids, xids), so two sinks, or two jobs, must never share one.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SinkId(String);

impl SinkId {
    /// A sink id: 1 to 64 characters of ASCII letters, digits, `-` and `_`, so it can be embedded in file names,
    /// object keys, Kafka transactional ids and XA xids unquoted.
    ///
    /// # Errors
    /// [`Config`](crate::ErrorKind::Config) naming the id and the rule.
    pub fn new(id: impl Into<String>) -> crate::Result<Self> {
        let id = id.into();
        let valid = !id.is_empty()
            && id.len() <= 64
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if valid {
            Ok(Self(id))
        } else {
            Err(crate::Error::new(
                crate::ErrorKind::Config,
                crate::Phase::Setup,
                format!("invalid sink id {id:?}: use 1 to 64 ASCII letters, digits, '-' or '_'"),
            ))
        }
    }

    /// The id as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for SinkId {
    type Error = crate::Error;

    fn try_from(id: String) -> crate::Result<Self> {
        Self::new(id)
    }
}

impl From<SinkId> for String {
    fn from(id: SinkId) -> String {
        id.0
    }
}

impl fmt::Display for SinkId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The index of one parallel instance (task) of a sink.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SubtaskId(pub u32);

impl fmt::Display for SubtaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sink_id_rejects_characters_that_cannot_be_embedded() {
        assert!(SinkId::new("orders_eu-1").is_ok());
        for bad in ["", "a/b", "a b", "ä", &"x".repeat(65)] {
            let err = SinkId::new(bad).unwrap_err().to_string();
            assert!(err.contains("invalid sink id"), "{err}");
            let parsed: Result<SinkId, _> = serde_json::from_value(serde_json::json!(bad));
            assert!(parsed.is_err(), "{bad:?} deserialized");
        }
    }
}
