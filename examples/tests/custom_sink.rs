//! The custom sink example passes the conformance harness.
#![allow(clippy::disallowed_methods)] // tests, benches and examples read the services' endpoints and their modes from the environment

#[path = "../custom_sink.rs"]
mod example;

#[test]
fn the_custom_sink_example_passes_the_conformance_harness() {
    example::main();
}
