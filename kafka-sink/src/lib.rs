//! Exactly-once Kafka sink over Kafka's transactional producer.
//!
//! This release has the producer side the sink stands on: configuration with the keys the sink controls locked
//! down ([`KafkaSinkConfig`]), a small bounded pool of deterministic transactional ids ([`TransactionalIdPool`],
//! never one id per checkpoint, which is how Flink's id explosion happens), opening a transactional producer with
//! epoch fencing of any older instance ([`open_transactional_producer`]), and the classification of librdkafka's
//! errors into what the driver does ([`classify`]).
//!
//! # Mechanism
//! Each subtask owns `pool_size` transactional ids `<prefix>-<subtask>-<slot>`. `init_transactions` on an id bumps
//! its producer epoch: any older producer with that id (a zombie) is fenced and its open transaction is aborted.
//! Readers must use `isolation.level=read_committed`.
#![deny(missing_docs)]

mod config;
mod error;
mod producer;
mod txn_id;

pub use config::KafkaSinkConfig;
pub use error::classify;
pub use producer::open_transactional_producer;
pub use txn_id::{TransactionalId, TransactionalIdPool};
