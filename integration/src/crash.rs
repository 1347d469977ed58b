//! Real crashes for tests: a child process (the test binary itself) runs a job and sends itself SIGKILL at a
//! protocol step, so nothing in it gets to clean up; the parent then recovers and checks the external system.

use std::os::unix::process::ExitStatusExt;
use std::process::Command;
use std::sync::Arc;

use connector_api::{CheckpointId, FaultInjector, FaultPoint, SinkHandle, Step};

/// The steps a child can be killed at: after the checkpoint's batches were written (the job loop's to handle),
/// after pre-commit, after the checkpoint record is durable, after commit (on the commit task, while the job loop
/// already writes the next checkpoint), and while committing (the job loop kills the process right after writing
/// the next checkpoint's first batch, with the commit just started on its task).
pub const KILL_STEPS: [Step; 5] = [
    Step::AfterWrite,
    Step::AfterPreCommit,
    Step::AfterRecordDurable,
    Step::AfterCommit,
    Step::WhileCommitting,
];

/// Sends SIGKILL to this process.
pub fn kill_self() -> ! {
    let _ = Command::new("kill")
        .args(["-KILL", &std::process::id().to_string()])
        .status();
    loop {
        std::thread::park();
    }
}

/// A fault injector that kills this process at `step` (one of [`KILL_STEPS`] but `after-write` and
/// `while-committing`, which the job loop handles) of checkpoint `checkpoint`.
pub fn kill_at(step: Step, checkpoint: u64) -> FaultInjector {
    Arc::new(move |current: CheckpointId, fault: &FaultPoint| {
        if fault.step() == step && current.0 == checkpoint {
            kill_self();
        }
        false
    })
}

/// Checkpoints a job killed at `step` of checkpoint `crash` has made durable, counting from the first real one
/// (a fresh start consumes checkpoint id 1, so the first real checkpoint is 2).
pub fn durable_before(step: Step, crash: u64) -> u64 {
    let completed = crash - 2;
    match step {
        Step::AfterRecordDurable | Step::AfterCommit | Step::WhileCommitting => completed + 1,
        _ => completed,
    }
}

/// Runs the test `entry_point` of the current test binary with `env_var=spec` and checks that it died by SIGKILL.
pub fn run_killed_child(entry_point: &str, env_var: &str, spec: &str) {
    let status = Command::new(std::env::current_exe().expect("test binary path"))
        .args(["--exact", entry_point, "--nocapture", "--test-threads", "1"])
        .env(env_var, spec)
        .status()
        .expect("cannot start the child test process");
    assert_eq!(
        status.signal(),
        Some(9),
        "the child ({spec}) should have died by SIGKILL, got {status}"
    );
}

/// The child's job: starts `driver` (whose sink `sink` is the sink under test) with a [`kill_at`] injector for
/// `step` of checkpoint `crash`, then writes checkpoints of `batches` batches made by `batch` from consecutive id
/// ranges of `rows`, until it kills itself (at `after-write`, once checkpoint `crash` is written; at
/// `while-committing`, once the first batch after checkpoint `crash` is written). Commits overlap the next
/// checkpoint's writes, as in production: the loop never waits for them.
pub async fn run_until_killed<S: connector_api::CheckpointStore>(
    driver: connector_api::Driver<S>,
    sink: SinkHandle,
    step: Step,
    crash: u64,
    batches: i64,
    rows: i64,
    batch: impl Fn(std::ops::Range<i64>) -> arrow_array::RecordBatch,
) -> ! {
    let mut driver = driver.with_fault_injector(kill_at(step, crash));
    driver.start().await.expect("child start");
    let mut next = 0;
    loop {
        let checkpoint = driver.current_checkpoint().0;
        for _ in 0..batches {
            driver
                .write(sink, &batch(next..next + rows))
                .await
                .expect("child write");
            next += rows;
        }
        if step == Step::AfterWrite && checkpoint == crash {
            kill_self();
        }
        driver
            .checkpoint(crate::conformance::conformance_positions(next))
            .await
            .expect("child checkpoint");
        if step == Step::WhileCommitting && checkpoint == crash {
            driver
                .write(sink, &batch(next..next + rows))
                .await
                .expect("child write");
            kill_self();
        }
    }
}
