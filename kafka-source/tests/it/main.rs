//! Integration tests of the Kafka source against the real broker: positions, decoding, retention gaps and grown
//! topics, Avro through a schema registry, Debezium change events: one test binary for the crate (`cargo test -p kafka-source --test it`).

mod debezium;
mod log_edges;
mod registry;
mod source;
