//! Integration tests of the JDBC sink against PostgreSQL and MariaDB, read back with psql and mariadb: one test
//! binary for the crate (`cargo test -p jdbc-sink --test it`).
//!
//! Tests that disturb a shared server, or measure time limits under injected faults, are binaries of their own
//! (`tests/*.rs`): cargo runs test binaries one after another, so nothing else runs while they do:
//! - faults (kills every idle-in-transaction session of the database);
//! - grey (time limits under Toxiproxy faults);
//! - restart (restarts PostgreSQL);
#![allow(clippy::disallowed_methods)] // tests, benches and examples read the services' endpoints and their modes from the environment

mod changes;
#[path = "../common/mod.rs"]
mod common;
mod conformance;
mod evolution;
mod factory;
mod kill9;
mod mariadb_detach;
mod markers;
mod tombstones;
mod types;
mod upsert;
