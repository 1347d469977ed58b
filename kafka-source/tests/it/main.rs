//! Integration tests of the Kafka source against the real broker: positions, decoding, retention gaps and grown
//! topics: one test binary for the crate (`cargo test -p kafka-source --test it`).

mod log_edges;
mod source;
