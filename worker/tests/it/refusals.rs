//! What `ratchet run` refuses before it touches anything: a Kafka cluster that does not answer (reported within
//! 30 s, naming the address and what to check, by `run`, `check-config` and `demo`, instead of a silent wait in
//! librdkafka's reconnect loop), and a job whose subtask count
//! changed since its checkpoints were written (partitions would move to subtasks without their positions).

use crate::common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::Job;

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

#[tokio::test(flavor = "multi_thread")]
async fn a_changed_subtask_count_is_refused_naming_both_counts() {
    let mut job = Job::new("recount", 2, 2, "3s").await;
    job.produce(100).await;
    let mut worker = job.spawn_worker(&["--exit-when-idle", "2s"]);
    worker.wait_exit(Duration::from_secs(120));
    let text = std::fs::read_to_string(&job.config).unwrap();
    std::fs::write(&job.config, text.replace("subtasks = 2", "subtasks = 3")).unwrap();
    let out = job.ratchet("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("has 2 subtasks") && stderr.contains("says 3"),
        "{stderr}"
    );
    job.assert_exactly_once();
}
