//! The custom sink example passes the conformance harness.

#[path = "../custom_sink.rs"]
mod example;

#[test]
fn the_custom_sink_example_passes_the_conformance_harness() {
    example::main();
}
