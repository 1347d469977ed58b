//! Integration tests of the file sink against local disk and SeaweedFS (S3), read back with pyarrow and boto3: one
//! test binary for the crate (`cargo test -p file-sink --test it`).

mod behaviour;
mod common;
mod conformance;
mod kill9;
mod s3_publish;
