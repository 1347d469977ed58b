//! Ratchet's test support against the real services that `scripts/services.sh up` starts: their endpoints
//! ([`Services`]), the independent verifiers (Python readers that never use Ratchet code) tests check results with,
//! Toxiproxy faults ([`toxiproxy`]) and pause points ([`pause`]). The conformance harness, the reference sink and
//! the `kill -9` runner are in `ratchet-conformance`, which a sink outside this repository can use too.
//!
//! ```no_run
//! let services = test_support::Services::get();
//! let bootstrap = services.kafka_bootstrap(); // fails, naming `scripts/services.sh up`, when Kafka is down
//! let seen = services.verify("kafka_read_committed.py", &[bootstrap, "my-topic"]);
//! ```
#![deny(missing_docs)]

pub mod cdc;
pub mod pause;
mod services;
pub mod toxiproxy;

pub use ratchet_conformance::unique_name;
pub use services::{RegistryEndpoint, S3Endpoint, Services, repo_root};
