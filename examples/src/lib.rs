//! Runnable examples (`cargo run -p ratchet-examples --example <name>`), built by CI with `cargo build --examples`:
//!
//! - `kafka_job`: a tokio job that reads a Kafka topic and writes it exactly once to Parquet files and to another
//!   Kafka topic, through the checkpoint driver, with its own checkpoint timer;
//! - `transformed_job`: the same with a SQL transform between the source and the sink (`transform::Transform`:
//!   a filter, a hashed column, a cast to a decimal), the sink built for the transform's output;
//! - `custom_sink`: a sink written from scratch (JSON lines files in a directory) that implements
//!   `TwoPhaseCommit` and proves itself with the conformance harness (tests/custom_sink.rs runs it).
