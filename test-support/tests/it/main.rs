//! test-support's own acceptance tests, against the real services: the fault tools other crates' tests rely on.

mod toxiproxy;
