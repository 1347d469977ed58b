//! Changing a job's subtask count: 2 -> 3 (by `ratchet rescale`, killed with SIGKILL after each step before the
//! switch, then by `ratchet run` killed right after it) -> 1 (by `ratchet rescale`), with records produced between
//! every step and a worker killed mid-checkpoint before each change. Every record lands once in all four sinks
//! (the independent readers), nothing is left open or prepared, no old layout's checkpoint record stays, and
//! `inspect` lists the layout history.

use crate::common;

use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Output};
use std::time::Duration;

use common::Job;
use test_support::Services;

/// `ratchet rescale --to <to>` on the job file, killed at `kill_at` when given.
fn rescale(job: &Job, to: u32, kill_at: Option<&str>) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ratchet"));
    command
        .args(["rescale", "--to", &to.to_string(), "--config"])
        .arg(&job.config)
        .env("RUST_BACKTRACE", "0");
    if let Some(step) = kill_at {
        command.env("RATCHET_RESCALE_KILL_AT", step);
    }
    command.output().unwrap()
}

fn said(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr)
}

fn set_subtasks(job: &Job, from: u32, to: u32) {
    job.edit_config(&format!("subtasks = {from}"), &format!("subtasks = {to}"));
}

/// The checkpoint rows under each of the job's store keys.
fn records_by_key(job: &Job) -> String {
    Services::get().psql(&format!(
        "select job, count(*) from ratchet_checkpoint_records where job like '{}%' group by job order by job",
        job.name
    ))
}

#[tokio::test(flavor = "multi_thread")]
async fn rescaling_two_to_three_to_one_survives_a_kill_at_every_step() {
    let mut job = Job::new("rescale", 6, 2, "3s").await;
    job.produce(600).await;
    let mut worker = job.spawn_worker(&[]);
    job.wait_delivered(Duration::from_secs(120));
    job.produce(300).await;
    // Killed with checkpoints in flight: the rescale resolves what it left.
    worker.kill9();

    set_subtasks(&job, 2, 3);
    for step in ["after-resolve", "after-new-records"] {
        let out = rescale(&job, 3, Some(step));
        assert_eq!(out.status.signal(), Some(9), "{step}: {}", said(&out));
        // Not switched: the old layout stands.
        let check = job.ratchet("check-config");
        assert!(
            said(&check).contains("the store records 2 subtask(s) and the job file says 3"),
            "{step}: {}",
            said(&check)
        );
        job.produce(100).await;
    }
    // `run` rescales first; killed right after the switch, before the old layout's records are retired.
    job.spawn_worker_with_env(&[], &[("RATCHET_RESCALE_KILL_AT", "after-switch")])
        .wait_killed(Duration::from_secs(120));
    assert!(
        records_by_key(&job).contains(&format!("{}|", job.name)),
        "the old layout's records are there until retired"
    );
    job.produce(200).await;
    let mut worker = job.spawn_worker(&[]);
    job.wait_delivered(Duration::from_secs(120));
    job.produce(300).await;
    worker.kill9();

    let out = rescale(&job, 1, None);
    assert!(out.status.success(), "{}", said(&out));
    assert!(
        said(&out).contains("rescaled from 3 to 1 subtasks (layout generation 2)"),
        "{}",
        said(&out)
    );
    set_subtasks(&job, 3, 1);
    job.produce(200).await;
    job.spawn_worker(&["--exit-when-idle", "2s"])
        .wait_exit(Duration::from_secs(120));
    job.assert_exactly_once();

    let inspect = job.ratchet("inspect");
    let listed = said(&inspect);
    assert!(
        inspect.status.success()
            && listed.contains("layout generation 1: 2 -> 3 subtask(s)")
            && listed.contains("layout generation 2: 3 -> 1 subtask(s)"),
        "{listed}"
    );
    assert_eq!(
        records_by_key(&job)
            .trim()
            .lines()
            .map(|l| l.split('|').next().unwrap().to_string())
            .collect::<Vec<_>>(),
        vec![format!("{}@2", job.name)],
        "only the current layout's records stay"
    );
}

/// Two processes started at once with a new count (a rolling update): one rescales while the other waits for it,
/// then both run the new layout; one change in the history, every record once.
#[tokio::test(flavor = "multi_thread")]
async fn two_processes_starting_with_a_new_count_rescale_once() {
    let mut job = Job::new("rescale2", 4, 2, "3s").await;
    job.produce(400).await;
    job.spawn_worker(&["--exit-when-idle", "2s"])
        .wait_exit(Duration::from_secs(120));
    set_subtasks(&job, 2, 4);
    let mut first = job.spawn_worker(&["--exit-when-idle", "3s"]);
    let mut second = job.spawn_worker(&["--exit-when-idle", "3s"]);
    job.produce(400).await;
    first.wait_exit(Duration::from_secs(180));
    second.wait_exit(Duration::from_secs(180));
    job.assert_exactly_once();
    let listed = said(&job.ratchet("inspect"));
    assert_eq!(
        listed.matches("layout generation").count(),
        1,
        "one change expected:\n{listed}"
    );
    assert!(
        listed.contains("layout generation 1: 2 -> 4 subtask(s)"),
        "{listed}"
    );
}
