//! Integration tests of the file sink against local disk and SeaweedFS (S3), read back with pyarrow and boto3: one
//! test binary for the crate (`cargo test -p file-sink --test it`).
#![allow(clippy::disallowed_methods)] // tests, benches and examples read the services' endpoints and their modes from the environment

mod behaviour;
mod common;
mod conformance;
mod kill9;
mod s3_publish;
