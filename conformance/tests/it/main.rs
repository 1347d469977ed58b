//! Integration tests of the driver and the conformance harness, in process (the reference sink and broken stores):
//! one test binary for the crate (`cargo test -p ratchet-conformance --test it`).

mod driver;
mod harness;
mod kill9;
