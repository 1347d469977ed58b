//! Integration tests of the Kafka sink against the real broker, read back with a read_committed confluent-kafka
//! consumer: one test binary for the crate (`cargo test -p kafka-sink --test it`).
//!
//! Tests that disturb a shared server, or measure time limits under injected faults, are binaries of their own
//! (`tests/*.rs`): cargo runs test binaries one after another, so nothing else runs while they do:
//! - grey (cuts off the broker through the shared Toxiproxy proxy);
#![allow(clippy::disallowed_methods)] // tests, benches and examples read the services' endpoints and their modes from the environment

mod at_least_once;
mod avro_values;
mod claim_fence;
mod conformance;
mod coordinator;
mod expiry;
mod json_schema_values;
mod kafka_to_kafka;
mod kill9;
mod probe;
mod producer;
mod protobuf_values;
mod records;
mod secure;
mod shared_partition;
