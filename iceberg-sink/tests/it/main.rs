//! Integration tests of the Iceberg sink against SQL and REST catalogs on local and S3 warehouses, read back with
//! pyiceberg: one test binary for the crate (`cargo test -p iceberg-sink --test it`).
#![allow(clippy::disallowed_methods)] // tests, benches and examples read the services' endpoints and their modes from the environment

mod cleanup;
mod common;
mod compaction;
mod conformance;
mod evolution;
mod hung;
mod kill9;
mod lineage;
mod maintenance;
mod races;
mod tables;
mod types;
mod upsert;
mod upsert_compaction;
mod vectors;
