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
