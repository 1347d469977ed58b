//! Scale-out under failure: three `ratchet run` processes share six subtasks through the leases in PostgreSQL;
//! one is killed with SIGKILL while records flow (its subtasks hold open and pre-committed transactions at 500 ms
//! checkpoints), another is paused with SIGSTOP past its lease and resumed after its subtasks were taken over.
//! The survivors take the subtasks over within the documented bound, and the independent readers of all three
//! sinks (pyarrow for the files, a read_committed consumer for Kafka, psycopg for the table) see every record
//! exactly once, with no open transaction, prepared transaction or staged file left once every subtask recovered
//! one last time.

use crate::common;

use std::time::{Duration, Instant};

use common::Job;
use nix::sys::signal::Signal;

/// The job's lease; the renewal period is a fifth of it.
const LEASE: Duration = Duration::from_secs(3);

#[tokio::test(flavor = "multi_thread")]
async fn three_processes_share_the_subtasks_through_a_kill_and_a_pause() {
    let mut job = Job::new("scale", 6, 6, "3s").await;
    let mut a = job.spawn_worker(&[]);
    let mut b = job.spawn_worker(&[]);
    let mut c = job.spawn_worker(&[]);
    job.wait_spread(6, 3, Duration::from_secs(60));
    job.produce(4000).await;

    // SIGKILL while records flow: the next batch is on its way when `a` dies.
    job.produce(4000).await;
    a.kill9();
    let killed = Instant::now();
    job.wait_spread(6, 2, Duration::from_secs(60));
    let took = killed.elapsed();
    // Lease expiry + one renewal period + claim and recovery of two subtasks.
    let bound = LEASE + LEASE / 5 + Duration::from_secs(20);
    assert!(
        took < bound,
        "the killed process's subtasks were taken over after {took:?} (bound {bound:?})"
    );
    job.produce(4000).await;

    // Paused past its lease: `c` takes everything over; `b` wakes up to find its subtasks claimed.
    b.signal(Signal::SIGSTOP);
    job.produce(4000).await;
    job.wait_spread(6, 1, Duration::from_secs(60));
    job.produce(4000).await;
    b.signal(Signal::SIGCONT);
    job.wait_spread(6, 2, Duration::from_secs(60));
    job.produce(4000).await;

    job.wait_delivered(Duration::from_secs(120));
    b.stop(Duration::from_secs(60));
    c.stop(Duration::from_secs(60));
    let woke = b.log_text();
    assert!(
        woke.contains("lease lost") || woke.contains("took this subtask over"),
        "the paused process did not notice the take-over:\n{woke}"
    );
    // What the zombie pre-committed after its replacement recovered (a hidden pending file) is undecided forever,
    // and removed by the subtask's next recovery (docs/architecture.md): one more run recovers every subtask.
    let mut last = job.spawn_worker(&["--exit-when-idle", "2s"]);
    last.wait_exit(Duration::from_secs(120));
    job.assert_exactly_once();
}

/// Static membership (`--member i --of M`): two processes each run their share (`s % 2 == i`) with no lease
/// tables; a rolling restart of both moves nothing (each subtask waits for its member), nor does a SIGKILL (the
/// member started again recovers its own) or a SIGSTOP past the lease (nothing takes over); a third process started as
/// a duplicate member (the ordinal at the end of a pod name) claims that member's subtasks, and the process it
/// fenced stops them for good and says so, instead of claiming them back. Every record exactly once, read by the
/// independent readers.
#[tokio::test(flavor = "multi_thread")]
async fn static_members_run_their_share_and_a_duplicate_is_fenced_and_reported() {
    let mut job = Job::new("static", 4, 4, "3s").await;
    let member = |i: &'static str| ["--member", i, "--of", "2"];
    let mut a = job.spawn_worker(&member("0"));
    let mut b = job.spawn_worker(&member("1"));
    job.produce(3000).await;
    job.wait_delivered(Duration::from_secs(120));
    assert!(a.log_text().contains("subtasks={0, 2}"), "{}", a.log_text());
    assert!(b.log_text().contains("subtasks={1, 3}"), "{}", b.log_text());

    // A rolling restart: nothing moves, each member picks its own subtasks up again.
    a.stop(Duration::from_secs(60));
    a = job.spawn_worker(&member("0"));
    b.stop(Duration::from_secs(60));
    b = job.spawn_worker(&member("1"));
    job.produce(3000).await;
    job.wait_delivered(Duration::from_secs(120));

    // SIGKILL with records flowing: the member's subtasks wait for it; started again (as an orchestrator does), it
    // recovers them.
    job.produce(2000).await;
    a.kill9();
    a = job.spawn_worker(&member("0"));
    // SIGSTOP past the lease: nobody takes its subtasks over (there are no leases); they go on at SIGCONT.
    b.signal(Signal::SIGSTOP);
    job.produce(1000).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    b.signal(Signal::SIGCONT);
    job.wait_delivered(Duration::from_secs(120));
    assert!(
        !a.log_text().contains("subtask=1") && !a.log_text().contains("subtask=3"),
        "member 0 ran member 1's subtasks:\n{}",
        a.log_text()
    );

    // A duplicate of member 1 (a pod name ending in its ordinal): it claims subtasks 1 and 3; `b` reports it.
    let mut duplicate = job.spawn_worker(&["--member", "ratchet-1", "--of", "2"]);
    // `b` learns it was fenced at its next checkpoint, which records start (an idle subtask does not
    // checkpoint): records produced once the duplicate has claimed both subtasks.
    duplicate.wait_logged("subtask claimed and recovered", 2, Duration::from_secs(60));
    job.produce(3000).await;
    b.wait_logged(
        "1 other process(es) run as static member 1 of 2 (two pods or instances with one ordinal)",
        1,
        Duration::from_secs(60),
    );
    job.wait_delivered(Duration::from_secs(120));
    for worker in [&mut a, &mut b, &mut duplicate] {
        worker.stop(Duration::from_secs(60));
    }
    let mut last = job.spawn_worker(&["--exit-when-idle", "2s"]);
    last.wait_exit(Duration::from_secs(120));
    job.assert_exactly_once();
}
