//! A topic's identity and partitions, asked over the protocol-level client: librdkafka's metadata has no topic id,
//! and the topic id is what tells a topic apart from one deleted and created again under the same name (whose
//! offsets start over, so a saved position means nothing there).

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use base64::Engine;
use connector_api::{Error, ErrorKind, Phase, Result};
use kafka_protocol::error::{ParseResponseErrorCode, ResponseError};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{ApiKey, MetadataRequest, TopicName};
use kafka_protocol::protocol::StrBytes;

use crate::{KafkaConnection, WireConnection};

/// The newest Metadata version this client speaks (topic ids come with version 10).
const METADATA_VERSION: i16 = 12;

/// A topic's id: assigned by the cluster when the topic is created, new for a topic deleted and created again under
/// the same name. Shown as Kafka's tools show it (`kafka-topics.sh --describe`: URL-safe base64 without padding).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TopicId([u8; 16]);

impl TopicId {
    /// Parses the form [`Display`](fmt::Display) writes.
    pub fn parse(text: &str) -> Option<Self> {
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(text)
            .ok()?;
        Some(Self(bytes.try_into().ok()?))
    }
}

impl fmt::Display for TopicId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(self.0))
    }
}

/// What the cluster says about one topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicMetadata {
    /// Its id (`None` from a broker older than Kafka 2.8, which has no topic ids).
    pub id: Option<TopicId>,
    /// Its partitions, ascending.
    pub partitions: Vec<i32>,
}

impl KafkaConnection {
    /// Opens a protocol-level connection to the first bootstrap server that answers.
    ///
    /// # Errors
    /// The last server's error when none answers ([`open`](Self::open)).
    pub async fn open_any(&self) -> Result<WireConnection> {
        let mut last = None;
        for address in self
            .bootstrap_servers()
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
        {
            match self.open(address).await {
                Ok(connection) => return Ok(connection),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| {
            Error::new(
                ErrorKind::Config,
                Phase::Setup,
                "no bootstrap servers given",
            )
        }))
    }

    /// The id and partitions of `topic`, or `None` when the cluster has no such topic. Never creates it. Bounded
    /// by `within` in all (connecting included).
    ///
    /// # Errors
    /// [`Retryable`](ErrorKind::Retryable) when no broker answers in time or the cluster reports a transient
    /// error for the topic (a leader election, a topic being created); [`Config`](ErrorKind::Config) when the
    /// connection settings are refused (TLS, SASL) or the topic is not authorized.
    pub async fn topic_metadata(
        &self,
        topic: &str,
        within: Duration,
    ) -> Result<Option<TopicMetadata>> {
        Ok(self
            .topics_metadata(Some(&[topic.to_string()]), within)
            .await?
            .remove(topic))
    }

    /// The ids and partitions of `topics` (`None`: every topic of the cluster this client may describe, internal
    /// topics left out), by name; a named topic the cluster does not have is absent. One Metadata request, bounded
    /// by `within` in all (connecting included); never creates a topic.
    ///
    /// # Errors
    /// As [`topic_metadata`](Self::topic_metadata), for any topic of the answer (listing every topic, a topic
    /// this client may not describe is left out instead).
    pub async fn topics_metadata(
        &self,
        topics: Option<&[String]>,
        within: Duration,
    ) -> Result<BTreeMap<String, TopicMetadata>> {
        let bootstrap = self.bootstrap_servers().to_string();
        let asked = match topics {
            Some([one]) => format!("topic {one}"),
            Some(many) => format!("topics {}", many.join(", ")),
            None => "every topic".to_string(),
        };
        let ask = async {
            let mut connection = self.open_any().await?;
            let version = connection
                .version(ApiKey::Metadata, METADATA_VERSION)
                .await?;
            let request = MetadataRequest::default()
                .with_topics(topics.map(|names| {
                    names
                        .iter()
                        .map(|name| {
                            MetadataRequestTopic::default()
                                .with_name(Some(TopicName(StrBytes::from_string(name.clone()))))
                        })
                        .collect()
                }))
                .with_allow_auto_topic_creation(false);
            connection.send(version, &request).await
        };
        let response = tokio::time::timeout(within, ask)
            .await
            .map_err(|_| {
                Error::new(
                    ErrorKind::Retryable,
                    Phase::Setup,
                    format!(
                        "no Kafka broker at {bootstrap} answered a metadata request for {asked} within {within:?}"
                    ),
                )
            })?
            .map_err(|e| e.at_phase(Phase::Setup))?;
        let mut found = BTreeMap::new();
        for topic in response.topics {
            let Some(name) = topic.name.as_ref().map(|n| n.0.to_string()) else {
                continue;
            };
            if topics.is_none() && topic.is_internal {
                continue;
            }
            match topic.error_code.err() {
                None => {}
                Some(ResponseError::UnknownTopicOrPartition) => continue,
                Some(ResponseError::TopicAuthorizationFailed) if topics.is_none() => continue,
                Some(ResponseError::TopicAuthorizationFailed) => {
                    return Err(Error::new(
                        ErrorKind::Config,
                        Phase::Setup,
                        format!(
                            "the cluster at {bootstrap} does not allow this client to describe topic {name}"
                        ),
                    ));
                }
                Some(e) => {
                    return Err(Error::new(
                        ErrorKind::Retryable,
                        Phase::Setup,
                        format!("the cluster at {bootstrap} reports an error for topic {name}"),
                    )
                    .with_source(e));
                }
            }
            let id = *topic.topic_id.as_bytes();
            let mut partitions: Vec<i32> =
                topic.partitions.iter().map(|p| p.partition_index).collect();
            partitions.sort_unstable();
            found.insert(
                name,
                TopicMetadata {
                    id: (id != [0; 16]).then_some(TopicId(id)),
                    partitions,
                },
            );
        }
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_ids_print_as_kafka_tools_do_and_parse_back() {
        let id = TopicId([
            0x66, 0x9e, 0xa8, 0x73, 0x89, 0x75, 0x4e, 0xe6, 0xab, 0xce, 0x99, 0x51, 0xf6, 0x80,
            0xc1, 0x47,
        ]);
        assert_eq!(id.to_string(), "Zp6oc4l1TuarzplR9oDBRw");
        assert_eq!(TopicId::parse("Zp6oc4l1TuarzplR9oDBRw"), Some(id));
        assert_eq!(TopicId::parse("not an id"), None);
        assert_eq!(TopicId::parse("Zp6o"), None);
    }
}
