//! `ratchet demo` against an address where no broker listens fails within the 30 s budget, naming the address and
//! what to check, instead of waiting silently in librdkafka's reconnect loop.

use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn an_unreachable_kafka_is_reported_within_30_s_naming_the_address() {
    let state = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let output = Command::new(env!("CARGO_BIN_EXE_ratchet"))
        .args([
            "demo",
            "--bootstrap",
            "127.0.0.1:1",
            "--records",
            "10",
            "--state",
        ])
        .arg(state.path().join("state"))
        .arg("--out")
        .arg(state.path().join("out"))
        .output()
        .unwrap();
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success(),
        "the demo succeeded without a broker"
    );
    assert!(
        took < Duration::from_secs(30),
        "took {took:?} to report it: {stderr}"
    );
    assert!(
        stderr.contains("127.0.0.1:1") && stderr.contains("scripts/services.sh up kafka"),
        "{stderr}"
    );
}
