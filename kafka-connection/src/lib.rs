//! How every Ratchet Kafka client reaches the cluster.
//!
//! A [`KafkaConnection`] holds the bootstrap servers and the connection settings (in librdkafka's names:
//! `security.protocol`, `ssl.*`, `sasl.*`, `socket.*`). It builds both kinds of client Ratchet uses:
//! - librdkafka producers, consumers and admin clients start from [`KafkaConnection::client_config`];
//! - the protocol-level client ([`WireConnection`], opened with [`KafkaConnection::open`]) sends requests
//!   librdkafka cannot, such as committing another process's transaction (DescribeTransactions, EndTxn). It speaks
//!   TLS (rustls, with the same CA file and client certificate) and SASL PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512
//!   (rsasl). It also reads a topic's id ([`KafkaConnection::topic_metadata`]), which librdkafka does not expose.
//!
//! Settings only one of the two could honour are refused when the connection is built, naming the setting.
//! Secrets (`sasl.password`, ...) are redacted in `Debug` and never appear in errors.

mod metadata;
pub mod poll;
mod reachable;
mod settings;
mod wire;

pub use metadata::{TopicId, TopicMetadata};
pub use settings::{
    CONNECTION_PREFIXES, CONSUMER_DEFAULTS, KafkaConnection, SASL_MECHANISMS, is_secret, redacted,
};
pub use wire::WireConnection;
