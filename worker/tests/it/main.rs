//! Integration tests of the `ratchet` binary end to end against the real servers, read back by the independent
//! verifiers: one test binary for the crate (`cargo test -p worker --test it`).
//!
//! Tests that disturb a shared server, or measure time limits under injected faults, are binaries of their own
//! (`tests/*.rs`): cargo runs test binaries one after another, so nothing else runs while they do:
//! - chaos (restarts and cuts off the servers);
//! - grey (cuts off the broker through the shared Toxiproxy proxy);
#![allow(clippy::disallowed_methods)] // tests, benches and examples read the services' endpoints and their modes from the environment

mod avro;
mod check_config;
#[path = "../common/mod.rs"]
mod common;
mod compaction;
mod dead_letter;
mod demo;
mod deployment;
mod edges;
mod evolution;
mod group;
mod identity;
mod inspect;
mod job_file;
mod json_schema;
mod kafka_to_kafka;
mod liveness;
mod metadata;
mod observability;
mod protobuf;
mod reconfigure;
mod refusals;
mod rescale;
mod scale_out;
mod tombstones;
mod topics;
mod transforms;
mod types;
