//! Ratchet's conformance harness ([`conformance`]), the reference sink that proves it ([`reference`](mod@reference)), and test
//! support against the real services that `scripts/services.sh up` starts, with the independent verifiers (Python
//! readers that never use Ratchet code) tests check results with.
//!
//! ```no_run
//! let services = integration::Services::get();
//! let bootstrap = services.kafka_bootstrap(); // fails, naming `scripts/services.sh up`, when Kafka is down
//! let seen = services.verify("kafka_read_committed.py", &[bootstrap, "my-topic"]);
//! ```
#![deny(missing_docs)]

pub mod conformance;
pub mod crash;
pub mod pause;
pub mod reference;
mod services;
pub mod toxiproxy;

pub use services::{S3Endpoint, Services};

/// A name no other test run uses: `<prefix>-<pid>-<nanoseconds>`, for topics, tables, prefixes and directories.
pub fn unique_name(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{prefix}-{}-{nanos}", std::process::id())
}
