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

/// An identifier that is embedded unquoted in external names (file names, object keys, Kafka transactional ids,
/// XA xids): 1 to 64 ASCII letters, digits, `-` and `_`, checked when made (and when deserialized).
macro_rules! embeddable_id {
    ($(#[$doc:meta])* $name:ident, $what:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            #[doc = concat!("A ", $what, ": 1 to 64 ASCII letters, digits, `-` and `_`.")]
            ///
            /// # Errors
            /// [`Config`](crate::ErrorKind::Config) naming the id and the rule.
            pub fn new(id: impl Into<String>) -> crate::Result<Self> {
                let id = id.into();
                if embeddable(&id) {
                    Ok(Self(id))
                } else {
                    Err(crate::Error::new(
                        crate::ErrorKind::Config,
                        crate::Phase::Setup,
                        format!(
                            concat!("invalid ", $what, " {:?}: use 1 to 64 ASCII letters, digits, '-' or '_'"),
                            id
                        ),
                    ))
                }
            }

            /// The id as a string.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl TryFrom<String> for $name {
            type Error = crate::Error;

            fn try_from(id: String) -> crate::Result<Self> {
                Self::new(id)
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

embeddable_id!(
    /// The stable name of one sink in a job. It scopes, with the job's, everything the sink owns in the external
    /// system (file prefixes, transactional ids, xids), so two sinks of a job must never share one.
    SinkId,
    "sink id"
);

embeddable_id!(
    /// The stable name of a job: scopes everything its sinks own in external systems (with each sink's id, see
    /// [`SinkScope`]), so two jobs never touch each other's transactions, files, ledger entries or markers, even
    /// where their sinks have the same ids and write to the same table, topic or directory.
    JobId,
    "job name"
);

/// 1 to 64 ASCII letters, digits, `-` and `_`.
fn embeddable(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The name under which one sink of one job keeps its state in an external system: Kafka transactional-id
/// prefixes, file and staging names, prepared-transaction ids and their owner and marker rows.
///
/// `<job>~<sink>` for a job-scoped sink: `~` occurs in neither id, so two (job, sink) pairs never share a scope, and
/// a scope never contains `.` (the separator of the names built from it). The sink id alone for a sink configured
/// without a job (and for jobs started before sinks were scoped by their job: their names stay as they were), or
/// an explicit scope a sink's settings give.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SinkScope(String);

impl SinkScope {
    /// The scope of `sink` in `job` (`None`: the sink id alone).
    pub fn new(job: Option<&JobId>, sink: &SinkId) -> Self {
        match job {
            Some(job) => Self(format!("{job}~{sink}")),
            None => Self(sink.to_string()),
        }
    }

    /// Reads a scope back from a name built with it: a sink id, or `<job>~<sink>`.
    pub fn parse(text: &str) -> Option<Self> {
        let valid = match text.split_once('~') {
            Some((job, sink)) => embeddable(job) && embeddable(sink),
            None => embeddable(text),
        };
        valid.then(|| Self(text.to_string()))
    }

    /// The scope as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<SinkId> for SinkScope {
    /// An explicit scope from a sink's settings.
    fn from(id: SinkId) -> Self {
        Self(id.0)
    }
}

impl fmt::Display for SinkScope {
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
            assert!(JobId::new(bad).is_err(), "{bad:?}");
        }
        assert!(JobId::new("orders.eu").is_err());
    }

    #[test]
    fn scopes_of_different_jobs_and_sinks_never_coincide_and_parse_back() {
        let job = |id: &str| JobId::new(id).unwrap();
        let sink = |id: &str| SinkId::new(id).unwrap();
        let eu = SinkScope::new(Some(&job("orders-eu")), &sink("lake"));
        let us = SinkScope::new(Some(&job("orders-us")), &sink("lake"));
        assert_eq!(eu.as_str(), "orders-eu~lake");
        assert_ne!(eu, us);
        // `a~b-c` can only be job `a`, sink `b-c`: no other pair spells it.
        assert_ne!(
            SinkScope::new(Some(&job("a-b")), &sink("c")),
            SinkScope::new(Some(&job("a")), &sink("b-c"))
        );
        assert_eq!(SinkScope::new(None, &sink("lake")).as_str(), "lake");
        for scope in [eu, SinkScope::new(None, &sink("lake"))] {
            assert_eq!(SinkScope::parse(scope.as_str()), Some(scope.clone()));
        }
        for bad in ["", "a~", "~b", "a~b~c", "a.b", "a b"] {
            assert_eq!(SinkScope::parse(bad), None, "{bad:?}");
        }
    }
}
