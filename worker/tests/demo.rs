//! The demo pipeline end to end against the real broker: `ratchet demo` is killed with SIGKILL in the middle of
//! its run, restarted, and the output is read back with pyarrow: every record exactly once, nothing hidden left.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use integration::Services;

const RECORDS: u64 = 20_000;

/// One demo pipeline: a topic, an output directory and a checkpoint directory, 500 records per checkpoint.
struct Demo {
    _dir: tempfile::TempDir,
    out: std::path::PathBuf,
    state: std::path::PathBuf,
    topic: String,
}

impl Demo {
    fn new(name: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        Self {
            out: dir.path().join("out"),
            state: dir.path().join("checkpoints"),
            topic: integration::unique_name(name),
            _dir: dir,
        }
    }

    /// `ratchet demo` on this pipeline, producing `records` first.
    fn command(&self, records: u64) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ratchet"));
        cmd.args(["demo", "--bootstrap", Services::get().kafka_bootstrap()])
            .args(["--topic", &self.topic, "--checkpoint-every", "500"])
            .args(["--records", &records.to_string()])
            .arg("--out")
            .arg(&self.out)
            .arg("--state")
            .arg(&self.state);
        cmd
    }

    /// What pyarrow reads back from the output.
    fn read(&self) -> serde_json::Value {
        Services::get().verify(
            "parquet_dir.py",
            &[self.out.to_str().unwrap(), "partition", "offset"],
        )
    }
}

#[test]
fn killed_mid_run_and_restarted_writes_every_record_exactly_once() {
    let demo = Demo::new("ratchet-demo-test");
    let mut first = demo.command(RECORDS);
    let mut child = first
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

    let output = demo.command(0).output().unwrap();
    assert!(
        output.status.success(),
        "restart failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(String::from_utf8_lossy(&output.stdout).contains("resuming after durable checkpoint"));

    let seen = demo.read();
    assert_eq!(seen["rows"], RECORDS, "{seen}");
    assert_eq!(seen["distinct"], RECORDS, "{seen}");
    // Only the owner-epoch file stays hidden: no in-progress or pending file is left behind.
    let hidden: Vec<&str> = seen["hidden"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(
        hidden,
        [
            ".ratchet-owner-demo-parquet.0",
            ".ratchet-owner-demo-parquet.0.lock"
        ],
        "{seen}"
    );
}

fn signal(child: &std::process::Child, signal: &str) {
    let status = Command::new("kill")
        .args([signal, &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill {signal} failed");
}

/// Whether a process holds the exclusive lock on `path` (`flock -n` from util-linux fails then).
fn locked(path: &std::path::Path) -> bool {
    !Command::new("flock")
        .args(["-n", "-E", "75"])
        .arg(path)
        .arg("true")
        .status()
        .unwrap()
        .success()
}

/// The overlap a user meets in production: a run paused with SIGSTOP, a replacement started on the same state and
/// output that runs to the end, then the paused run resumed with SIGCONT. The resumed run must be fenced (it may
/// decide nothing), and every record must be visible exactly once, read back with pyarrow.
#[test]
fn a_paused_run_resumed_after_its_replacement_finished_is_fenced() {
    let demo = Demo::new("ratchet-demo-overlap");
    let state = demo.state.clone();
    let mut paused = demo
        .command(RECORDS)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(paused.stdout.take().unwrap());
    let mut line = String::new();
    while !line.starts_with("checkpoint 3:") {
        line.clear();
        assert!(
            stdout.read_line(&mut line).unwrap() > 0,
            "the first run ended before its third checkpoint"
        );
    }
    // Pause it outside the checkpoint store's short critical sections (a process paused inside one holds off its
    // replacement until it resumes, by design).
    loop {
        signal(&paused, "-STOP");
        if !locked(&state.join(".lock")) {
            break;
        }
        signal(&paused, "-CONT");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }

    let replacement = demo.command(0).output().unwrap();
    assert!(
        replacement.status.success(),
        "the replacement failed:\n{}",
        String::from_utf8_lossy(&replacement.stderr)
    );

    signal(&paused, "-CONT");
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut paused.stderr.take().unwrap(), &mut stderr).unwrap();
    let status = paused.wait().unwrap();
    assert!(
        !status.success(),
        "the resumed run finished as if it still owned the job:\n{rest}"
    );
    assert!(
        stderr.contains("claimed") || stderr.contains("newer instance"),
        "the resumed run did not stop as fenced:\n{stderr}"
    );

    let last = demo.command(0).output().unwrap();
    assert!(
        last.status.success(),
        "a start after the overlap failed:\n{}",
        String::from_utf8_lossy(&last.stderr)
    );
    let seen = demo.read();
    assert_eq!(seen["rows"], RECORDS, "{seen}");
    assert_eq!(seen["distinct"], RECORDS, "{seen}");
}
