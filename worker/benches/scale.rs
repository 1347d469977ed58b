//! Scale-out measured: 1, 2 and 3 `ratchet run` processes sharing a job of 6 subtasks on a 6-partition topic,
//! under each membership (leases in the PostgreSQL store; static members, `--member i --of M`; static members of
//! the job's Kafka group, `membership = "kafka-group"` with `--member member-<i>`), and what a
//! SIGKILL, a SIGSTOP past the lease and a rolling restart of every process cost in time and subtask moves.
//!
//! Run: `scripts/services.sh up && cargo bench -p worker --bench scale` (docs/benchmarks.md, "Scale-out").
//! `RATCHET_BENCH_RECORDS` sets the input of the throughput runs (default 600000); `RATCHET_BENCH_MEMBERSHIP`
//! (`leases`, `static` or `kafka-group`) measures one membership only. Every job: Parquet files exactly-once,
//! PostgreSQL store, 1 s checkpoints, `lease = "5s"` (the Kafka group's session timeout: 6 s, the broker's minimum).
//!
//! - Throughput: the processes read the filled topic until idle (`--exit-when-idle 3s`); the rate counts from
//!   the first record read to the last (the workers' `stopped` lines), CPU time is the processes' own.
//! - Disruptions, with 3 processes and a producer sending 2,000 records/s: each process's log is watched for
//!   `subtask claimed and recovered`. A *move* is a claim by another process than the subtask's last owner (a
//!   process started again in the same place, as an orchestrator does, is the same owner). *Back* is the time from
//!   the event until every subtask the disturbed process ran is claimed again (by anyone): a take-over, or the
//!   restarted process's own recovery. Killed and stopped processes are started again at once, as systemd or a
//!   StatefulSet would; a SIGSTOP lasts two leases (10 s).
#![allow(clippy::disallowed_methods)] // tests, benches and examples read the services' endpoints and their modes from the environment

mod limits;

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use limits::runs::{Rate, stopped_line};
use limits::{bootstrap, fill_input, producer};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use rdkafka::producer::{BaseRecord, Producer};
use test_support::Services;

const SUBTASKS: u32 = 6;
const LEASE: Duration = Duration::from_secs(5);
/// No new claim for this long: the processes have settled.
const QUIET: Duration = Duration::from_secs(8);
const CLAIMED: &str = "subtask claimed and recovered";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Membership {
    Leases,
    Static,
    KafkaGroup,
}

const MEMBERSHIPS: [Membership; 3] = [
    Membership::Leases,
    Membership::Static,
    Membership::KafkaGroup,
];

impl Membership {
    fn name(self) -> &'static str {
        match self {
            Self::Leases => "leases (PostgreSQL)",
            Self::Static => "static (--member i --of M)",
            Self::KafkaGroup => "kafka-group (static group members)",
        }
    }

    fn key(self) -> &'static str {
        match self {
            Self::Leases => "leases",
            Self::Static => "static",
            Self::KafkaGroup => "kafka-group",
        }
    }

    /// The `[job]` line that selects it.
    fn job_line(self) -> &'static str {
        match self {
            Self::KafkaGroup => "membership = \"kafka-group\"\n",
            Self::Leases | Self::Static => "",
        }
    }

    fn args(self, slot: usize, of: usize) -> Vec<String> {
        match self {
            Self::Leases => Vec::new(),
            Self::Static => vec![
                "--member".into(),
                slot.to_string(),
                "--of".into(),
                of.to_string(),
            ],
            Self::KafkaGroup => vec!["--member".into(), format!("member-{slot}")],
        }
    }
}

fn main() {
    let records: u64 = std::env::var("RATCHET_BENCH_RECORDS")
        .map(|r| r.parse().expect("RATCHET_BENCH_RECORDS: a record count"))
        .unwrap_or(600_000);
    let services = Services::get();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let input = test_support::unique_name("bench-scale-input");
    runtime.block_on(fill_input(&input, records, SUBTASKS as i32));

    let only = std::env::var("RATCHET_BENCH_MEMBERSHIP").ok();
    let memberships: Vec<Membership> = MEMBERSHIPS
        .into_iter()
        .filter(|m| only.as_deref().is_none_or(|o| o == m.key()))
        .collect();
    assert!(
        !memberships.is_empty(),
        "RATCHET_BENCH_MEMBERSHIP: leases, static or kafka-group"
    );
    let mut rates = Vec::new();
    for &membership in &memberships {
        for processes in 1..=3 {
            let dir = tempfile::tempdir().unwrap();
            let job = write_job(dir.path(), &input, membership, services);
            let rate = Rate::of(
                &run_until_idle(&job, membership, processes, dir.path())
                    .iter()
                    .map(|log| stopped_line(log))
                    .collect::<Vec<_>>(),
            );
            eprintln!("{membership:?} x{processes}: {rate:?}");
            rates.push((membership, processes, rate));
        }
    }

    let mut events = Vec::new();
    for &membership in &memberships {
        let topic = test_support::unique_name("bench-scale-live");
        runtime.block_on(limits::create_topic(&topic, SUBTASKS as i32));
        let feeding = Feeder::start(&topic);
        let dir = tempfile::tempdir().unwrap();
        let job = write_job(dir.path(), &topic, membership, services);
        let mut group = Group::start(&job, membership, 3, dir.path());
        group.settle();
        events.push((
            membership,
            "SIGKILL of one process",
            group.kill_and_restart(0),
        ));
        events.push((
            membership,
            "SIGSTOP of one process for 10 s",
            group.pause(1, 2 * LEASE),
        ));
        events.push((
            membership,
            "rolling restart of all 3 processes",
            group.rolling_restart(),
        ));
        group.stop();
        feeding.stop();
    }

    println!(
        "\n{records} records, 6 partitions, 6 subtasks, Parquet files exactly-once, PostgreSQL store, 1 s \
         checkpoints, 2 cores:\n"
    );
    println!(
        "| membership | processes | records/s | vs 1 process | CPU s per M records | peak RSS MB (largest) |"
    );
    println!("|---|---|---|---|---|---|");
    for (membership, processes, rate) in &rates {
        let one = rates
            .iter()
            .find(|(m, p, _)| m == membership && *p == 1)
            .unwrap()
            .2
            .records_per_second;
        println!(
            "| {} | {processes} | {:.0} | {:.0}% | {:.2} | {:.0} |",
            membership.name(),
            rate.records_per_second,
            100.0 * rate.records_per_second / one,
            rate.cpu_per_million,
            rate.peak_rss_mb
        );
    }
    println!("\n3 processes, 2,000 records/s flowing, lease 5 s:\n");
    println!("| membership | event | subtask moves | back after |");
    println!("|---|---|---|---|");
    for (membership, event, outcome) in &events {
        println!(
            "| {} | {event} | {} | {} |",
            membership.name(),
            outcome.moves,
            outcome.back
        );
    }
}

fn write_job(dir: &Path, topic: &str, membership: Membership, services: &Services) -> PathBuf {
    let name = test_support::unique_name("bench_scale").replace('-', "_");
    let text = format!(
        "[job]\nname = \"{name}\"\nsubtasks = {SUBTASKS}\ncheckpoint_interval = \"1s\"\nlease = \"{}s\"\n{}\n\
         [source]\nbootstrap_servers = \"{}\"\ntopic = \"{topic}\"\n\n\
         [store]\nkind = \"postgres\"\nurl = \"{}\"\n\n\
         [[sinks]]\ntype = \"file\"\nid = \"out\"\n\
         storage = {{ kind = \"local\", path = \"{}\" }}\nformat = {{ kind = \"parquet\", compression = \"zstd\" }}\n",
        LEASE.as_secs(),
        membership.job_line(),
        bootstrap(),
        services.pg_url(),
        dir.join("out").display()
    );
    let path = dir.join("job.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// Starts `ratchet run` as process `slot` of `of`, logging JSON to the end of `log`.
fn spawn(
    job: &Path,
    membership: Membership,
    slot: usize,
    of: usize,
    extra: &[&str],
    log: &Path,
) -> Child {
    let log = File::options().create(true).append(true).open(log).unwrap();
    Command::new(env!("CARGO_BIN_EXE_ratchet"))
        .args(["--log-format", "json", "run"])
        .args(extra)
        .args(membership.args(slot, of))
        .arg("--config")
        .arg(job)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap()
}

/// Runs `processes` processes until the topic is read; their logs.
fn run_until_idle(job: &Path, membership: Membership, processes: usize, dir: &Path) -> Vec<String> {
    let logs: Vec<PathBuf> = (0..processes)
        .map(|i| dir.join(format!("run-{i}.log")))
        .collect();
    let children: Vec<Child> = logs
        .iter()
        .enumerate()
        .map(|(slot, log)| {
            spawn(
                job,
                membership,
                slot,
                processes,
                &["--exit-when-idle", "3s"],
                log,
            )
        })
        .collect();
    children
        .into_iter()
        .zip(&logs)
        .map(|(mut child, log)| {
            let status = child.wait().unwrap();
            let text = std::fs::read_to_string(log).unwrap();
            assert!(status.success(), "worker failed:\n{text}");
            text
        })
        .collect()
}

/// Sends ~100-byte keyed records at 2,000 per second until stopped.
struct Feeder {
    running: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl Feeder {
    fn start(topic: &str) -> Self {
        let running = Arc::new(AtomicBool::new(true));
        let flag = running.clone();
        let topic = topic.to_string();
        let thread = std::thread::spawn(move || {
            let producer = producer();
            let note = "x".repeat(40);
            let mut i: u64 = 0;
            while flag.load(Ordering::Relaxed) {
                for _ in 0..20 {
                    let key = i.to_string();
                    let value = format!(r#"{{"order":{i},"note":"{note}"}}"#);
                    let _ = producer.send(BaseRecord::to(&topic).key(&key).payload(&value));
                    i += 1;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            producer.flush(Duration::from_secs(30)).unwrap();
        });
        Self { running, thread }
    }

    fn stop(self) {
        self.running.store(false, Ordering::Relaxed);
        self.thread.join().unwrap();
    }
}

/// What one disruption cost.
struct Outcome {
    moves: usize,
    back: String,
}

/// Processes sharing a job, each started again in its slot, and the claims their logs show.
struct Group {
    job: PathBuf,
    membership: Membership,
    children: Vec<Child>,
    logs: Vec<PathBuf>,
    /// Claim lines already counted, per slot.
    seen: Vec<usize>,
    /// The last owner (slot) of each subtask.
    owner: BTreeMap<u32, usize>,
    /// Claims since the last settle: (when seen, slot, subtask).
    claims: Vec<(Instant, usize, u32)>,
}

impl Group {
    fn start(job: &Path, membership: Membership, processes: usize, dir: &Path) -> Self {
        let logs: Vec<PathBuf> = (0..processes)
            .map(|i| dir.join(format!("live-{i}.log")))
            .collect();
        let children = logs
            .iter()
            .enumerate()
            .map(|(slot, log)| spawn(job, membership, slot, processes, &[], log))
            .collect();
        Self {
            job: job.to_path_buf(),
            membership,
            children,
            seen: vec![0; processes],
            logs,
            owner: BTreeMap::new(),
            claims: Vec::new(),
        }
    }

    /// Notes the claims logged since the last look.
    fn poll(&mut self) {
        for (slot, log) in self.logs.iter().enumerate() {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let subtasks: Vec<u32> = text
                .lines()
                .filter(|l| l.contains(CLAIMED))
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .filter_map(|v| v["fields"]["subtask"].as_u64())
                .map(|s| s as u32)
                .collect();
            for &subtask in &subtasks[self.seen[slot]..] {
                self.claims.push((Instant::now(), slot, subtask));
            }
            self.seen[slot] = subtasks.len();
        }
    }

    /// Waits until every subtask is claimed and no claim came for [`QUIET`]; the moves counted since the last
    /// settle (claims by another slot than the subtask's last owner).
    fn settle(&mut self) -> usize {
        let mut last = (Instant::now(), self.claims.len());
        loop {
            std::thread::sleep(Duration::from_millis(50));
            self.poll();
            if self.claims.len() != last.1 {
                last = (Instant::now(), self.claims.len());
            }
            let covered = (0..SUBTASKS).all(|s| {
                self.owner.contains_key(&s) || self.claims.iter().any(|(_, _, c)| *c == s)
            });
            if covered && last.0.elapsed() >= QUIET {
                break;
            }
            assert!(
                last.0.elapsed() < Duration::from_secs(180),
                "the processes never settled"
            );
        }
        let mut moves = 0;
        for (_, slot, subtask) in self.claims.drain(..) {
            if self
                .owner
                .insert(subtask, slot)
                .is_some_and(|before| before != slot)
            {
                moves += 1;
            }
        }
        moves
    }

    /// The subtasks `slot` runs now.
    fn held_by(&self, slot: usize) -> Vec<u32> {
        self.owner
            .iter()
            .filter(|(_, o)| **o == slot)
            .map(|(s, _)| *s)
            .collect()
    }

    /// Waits until each of `subtasks` was claimed again after `since`; how long that took.
    fn back(&mut self, subtasks: &[u32], since: Instant) -> Duration {
        loop {
            self.poll();
            let times: Vec<Instant> = subtasks
                .iter()
                .filter_map(|s| {
                    self.claims
                        .iter()
                        .find(|(_, _, c)| c == s)
                        .map(|(t, _, _)| *t)
                })
                .collect();
            if times.len() == subtasks.len() {
                return times.into_iter().max().unwrap_or(since) - since;
            }
            assert!(
                since.elapsed() < Duration::from_secs(180),
                "subtasks {subtasks:?} never came back"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn restart(&mut self, slot: usize) {
        let of = self.children.len();
        self.children[slot] = spawn(&self.job, self.membership, slot, of, &[], &self.logs[slot]);
    }

    fn kill_and_restart(&mut self, slot: usize) -> Outcome {
        let held = self.held_by(slot);
        let at = Instant::now();
        self.children[slot].kill().unwrap();
        self.children[slot].wait().unwrap();
        self.restart(slot);
        let back = self.back(&held, at);
        Outcome {
            moves: self.settle(),
            back: format!("{:.1} s", back.as_secs_f64()),
        }
    }

    fn pause(&mut self, slot: usize, pause: Duration) -> Outcome {
        let held = self.held_by(slot);
        let pid = Pid::from_raw(self.children[slot].id() as i32);
        let at = Instant::now();
        kill(pid, Signal::SIGSTOP).unwrap();
        while at.elapsed() < pause {
            self.poll();
            std::thread::sleep(Duration::from_millis(50));
        }
        kill(pid, Signal::SIGCONT).unwrap();
        let taken: Vec<u32> = held
            .iter()
            .copied()
            .filter(|s| self.claims.iter().any(|(_, _, c)| c == s))
            .collect();
        let back = match taken.len() {
            0 => format!(
                "not taken over: runs again at SIGCONT ({:.0} s)",
                pause.as_secs_f64()
            ),
            _ => format!("{:.1} s (taken over)", self.back(&taken, at).as_secs_f64()),
        };
        Outcome {
            moves: self.settle(),
            back,
        }
    }

    fn rolling_restart(&mut self) -> Outcome {
        let mut moves = 0;
        let mut longest = Duration::ZERO;
        for slot in 0..self.children.len() {
            let held = self.held_by(slot);
            let at = Instant::now();
            kill(
                Pid::from_raw(self.children[slot].id() as i32),
                Signal::SIGTERM,
            )
            .unwrap();
            self.children[slot].wait().unwrap();
            self.restart(slot);
            longest = longest.max(self.back(&held, at));
            moves += self.settle();
        }
        Outcome {
            moves,
            back: format!("{:.1} s per process at most", longest.as_secs_f64()),
        }
    }

    fn stop(mut self) {
        for child in &mut self.children {
            let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
            let _ = child.wait();
        }
    }
}
