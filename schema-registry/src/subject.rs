//! Subject name strategies: the subject a topic's key or value schema is registered under, named as the
//! serializers of Confluent's clients name it.

use serde::Deserialize;

use crate::RegistryError;

/// How a schema's subject is named (Confluent's `key.subject.name.strategy` / `value.subject.name.strategy`).
///
/// | strategy | subject | Confluent class |
/// |---|---|---|
/// | `topic-name` (default) | `<topic>-key` / `<topic>-value` | `TopicNameStrategy` |
/// | `record-name` | the record's full name, e.g. `com.acme.Order` | `RecordNameStrategy` |
/// | `topic-record-name` | `<topic>-<record full name>` | `TopicRecordNameStrategy` |
///
/// A reader only needs the subject to find the *latest* schema (the one its columns follow); records carry their
/// writer schema's global id, which is looked up by id whatever the strategy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SubjectStrategy {
    /// `<topic>-key` or `<topic>-value`.
    #[default]
    TopicName,
    /// The record's full name.
    RecordName,
    /// `<topic>-<record full name>`.
    TopicRecordName,
}

impl SubjectStrategy {
    /// The subject of `topic`'s key (`is_key`) or value schema whose record full name is `record`.
    ///
    /// # Errors
    /// [`RegistryError::Settings`] when the strategy needs the record's full name and `record` is `None`.
    pub fn subject(
        self,
        topic: &str,
        is_key: bool,
        record: Option<&str>,
    ) -> Result<String, RegistryError> {
        let record = || {
            record.ok_or_else(|| {
                RegistryError::Settings(format!(
                    "the subject strategy {self:?} names subjects after the record: set `record_name` (the Avro \
                     record's full name, e.g. com.acme.Order)"
                ))
            })
        };
        Ok(match self {
            Self::TopicName => format!("{topic}-{}", if is_key { "key" } else { "value" }),
            Self::RecordName => record()?.to_string(),
            Self::TopicRecordName => format!("{topic}-{}", record()?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_are_named_as_confluents_serializers_name_them() {
        let order = Some("com.acme.Order");
        assert_eq!(
            SubjectStrategy::TopicName
                .subject("orders", false, None)
                .unwrap(),
            "orders-value"
        );
        assert_eq!(
            SubjectStrategy::TopicName
                .subject("orders", true, order)
                .unwrap(),
            "orders-key"
        );
        assert_eq!(
            SubjectStrategy::RecordName
                .subject("orders", false, order)
                .unwrap(),
            "com.acme.Order"
        );
        assert_eq!(
            SubjectStrategy::TopicRecordName
                .subject("orders", false, order)
                .unwrap(),
            "orders-com.acme.Order"
        );
        let err = SubjectStrategy::RecordName
            .subject("orders", false, None)
            .unwrap_err();
        assert!(err.to_string().contains("record_name"), "{err}");
    }
}
