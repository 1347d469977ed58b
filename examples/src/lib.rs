//! Runnable examples (`cargo run -p ratchet-examples --example <name>`), built by CI with `cargo build --examples`:
//!
//! - `kafka_job`: a tokio job that reads a Kafka topic and writes it exactly once to Parquet files and to another
//!   Kafka topic, through the checkpoint driver, with its own checkpoint timer;
//! - `custom_sink`: a sink written from scratch (JSON lines files in a directory) that implements
//!   `TwoPhaseCommit` and proves itself with the conformance harness (tests/custom_sink.rs runs it).
