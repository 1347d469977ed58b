//! What `ratchet run` refuses before it touches anything: a Kafka cluster that does not answer (reported within
//! 30 s, naming the address and what to check, by `run`, `check-config` and `demo`, instead of a silent wait in
//! librdkafka's reconnect loop). (A changed subtask count is rescaled: `rescale.rs`.)

use std::process::Command;
use std::time::{Duration, Instant};

fn job_file(dir: &std::path::Path, bootstrap: &str) -> std::path::PathBuf {
    let path = dir.join("job.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[job]
name = "unreachable"

[source]
bootstrap_servers = "{bootstrap}"
topic = "nowhere"

[store]
kind = "local"
path = "{state}"

[[sinks]]
type = "file"
id = "out"
storage = {{ kind = "local", path = "{out}" }}
"#,
            state = dir.join("state").display(),
            out = dir.join("out").display()
        ),
    )
    .unwrap();
    path
}

#[test]
fn an_unreachable_kafka_is_reported_within_30_s_by_run_check_config_and_demo() {
    let dir = tempfile::tempdir().unwrap();
    let config = job_file(dir.path(), "127.0.0.1:1");
    let demo_dir = dir.path().join("demo");
    for command in ["run", "check-config", "demo"] {
        let started = Instant::now();
        let mut ratchet = Command::new(env!("CARGO_BIN_EXE_ratchet"));
        ratchet.arg(command).env("RUST_BACKTRACE", "0");
        if command == "demo" {
            ratchet
                .args(["--bootstrap", "127.0.0.1:1", "--dir"])
                .arg(&demo_dir);
        } else {
            ratchet.arg("--config").arg(&config);
        }
        let out = ratchet.output().unwrap();
        let took = started.elapsed();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!out.status.success(), "{command} succeeded: {said}");
        assert!(
            took < Duration::from_secs(30),
            "{command} took {took:?}: {said}"
        );
        assert!(
            said.contains("127.0.0.1:1") && said.contains("scripts/services.sh up kafka"),
            "{command}: {said}"
        );
    }
}
