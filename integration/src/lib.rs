//! Test support for Ratchet against the real services that `scripts/services.sh up` starts, and the independent
//! verifiers (Python readers that never use Ratchet code) tests check results with.
//!
//! ```no_run
//! let services = integration::Services::get();
//! let bootstrap = services.kafka_bootstrap(); // fails, naming `scripts/services.sh up`, when Kafka is down
//! let seen = services.verify("kafka_read_committed.py", &[bootstrap, "my-topic"]);
//! ```
#![deny(missing_docs)]

mod services;

pub use services::{S3Endpoint, Services};
