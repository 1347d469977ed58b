//! Chaos: `ratchet run` processes are killed with SIGKILL at random moments while records flow into four sinks at
//! once (Parquet files, Kafka, PostgreSQL, Iceberg), each killed process replaced by a new one, and one process
//! is paused with SIGSTOP past its lease in the middle of it and woken up later. The independent readers then see
//! every record exactly once in every sink, and nothing left behind.
//!
//! `RATCHET_CHAOS_KILLS` sets the number of kills (4 by default, as CI runs it; the long mode is hundreds: see
//! docs/benchmarks.md, "Chaos"), `RATCHET_CHAOS_SEED` replays a run (the seed is printed).

mod common;

use std::time::{Duration, Instant};

use common::{Job, Worker};
use nix::sys::signal::Signal;

/// A small deterministic generator (xorshift64*), so a failing run can be replayed from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number"))
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn random_sigkills_and_a_pause_leave_every_sink_exactly_once() {
    let kills = env_u64("RATCHET_CHAOS_KILLS").unwrap_or(4);
    let seed = env_u64("RATCHET_CHAOS_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
            | 1
    });
    eprintln!("chaos: {kills} kills, RATCHET_CHAOS_SEED={seed}");
    let mut rng = Rng(seed);
    let mut job = Job::new("chaos", 4, 4, "3s").await;
    let mut workers: Vec<Worker> = (0..3).map(|_| job.spawn_worker(&[])).collect();
    job.wait_spread(4, 3, Duration::from_secs(60));

    let started = Instant::now();
    let mut paused: Option<(Worker, Instant)> = None;
    for kill in 0..kills {
        // Records keep flowing between kills: 200..1200 of them, 0..1.5 s apart.
        job.produce(200 + rng.below(1000)).await;
        tokio::time::sleep(Duration::from_millis(rng.below(1500))).await;
        let victim = rng.below(workers.len() as u64) as usize;
        workers[victim].kill9();
        workers[victim] = job.spawn_worker(&[]);
        if kill == kills / 2 {
            // The paused process stays in `workers`' place count: a fourth one, paused past its lease.
            let sleeper = job.spawn_worker(&[]);
            tokio::time::sleep(Duration::from_secs(4)).await;
            sleeper.signal(Signal::SIGSTOP);
            paused = Some((sleeper, Instant::now()));
        }
        if let Some((sleeper, since)) =
            paused.take_if(|(_, since)| since.elapsed() > Duration::from_secs(8))
        {
            sleeper.signal(Signal::SIGCONT);
            eprintln!("woke the paused process after {:?}", since.elapsed());
            workers.push(sleeper);
        }
    }
    if let Some((sleeper, _)) = paused.take() {
        tokio::time::sleep(Duration::from_secs(7)).await;
        sleeper.signal(Signal::SIGCONT);
        workers.push(sleeper);
    }
    job.produce(1000).await;
    eprintln!(
        "chaos: {kills} kills in {:?}, {} records",
        started.elapsed(),
        job.produced
    );
    job.wait_delivered(Duration::from_secs(180));
    for worker in &mut workers {
        worker.stop(Duration::from_secs(60));
    }
    // One last run recovers every subtask (removing what zombies left undecided), then the readers check.
    let mut last = job.spawn_worker(&["--exit-when-idle", "2s"]);
    last.wait_exit(Duration::from_secs(120));
    job.assert_exactly_once();
}
