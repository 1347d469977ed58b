//! The demo pipeline end to end against the real broker: `ratchet demo` is killed with SIGKILL in the middle of
//! its run, restarted, and the output is read back with pyarrow: every record exactly once, nothing hidden left.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use integration::Services;

const RECORDS: u64 = 20_000;

fn ratchet() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ratchet"))
}

#[test]
fn killed_mid_run_and_restarted_writes_every_record_exactly_once() {
    let services = Services::get();
    let bootstrap = services.kafka_bootstrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let state = dir.path().join("checkpoints");
    let topic = integration::unique_name("ratchet-demo-test");
    let common = |cmd: &mut Command| {
        cmd.args([
            "demo",
            "--bootstrap",
            bootstrap,
            "--topic",
            &topic,
            "--checkpoint-every",
            "500",
        ])
        .arg("--out")
        .arg(&out)
        .arg("--state")
        .arg(&state);
    };

    let mut first = ratchet();
    common(&mut first);
    let mut child = first
        .args(["--records", &RECORDS.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let mut killed_after = None;
    for line in stdout.lines() {
        let line = line.unwrap();
        if line.starts_with("checkpoint 3:") {
            child.kill().unwrap(); // SIGKILL: no cleanup, whatever step it is in
            killed_after = Some(line);
            break;
        }
    }
    child.wait().unwrap();
    assert!(
        killed_after.is_some(),
        "the demo finished or failed before its third checkpoint"
    );

    let mut second = ratchet();
    common(&mut second);
    let output = second.args(["--records", "0"]).output().unwrap();
    assert!(
        output.status.success(),
        "restart failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(String::from_utf8_lossy(&output.stdout).contains("resuming after durable checkpoint"));

    let seen = services.verify(
        "parquet_dir.py",
        &[out.to_str().unwrap(), "partition", "offset"],
    );
    assert_eq!(seen["rows"], RECORDS, "{seen}");
    assert_eq!(seen["distinct"], RECORDS, "{seen}");
    // Only the owner-epoch file stays hidden: no in-progress or pending file is left behind.
    let hidden: Vec<&str> = seen["hidden"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(hidden, [".ratchet-owner-demo-parquet.0"], "{seen}");
}
