//! Chaos: `ratchet run` processes are killed with SIGKILL at random moments while records flow into four sinks at
//! once (Parquet files, Kafka, PostgreSQL, Iceberg), each killed process replaced by a new one, and one process
//! is paused with SIGSTOP past its lease in the middle of it and woken up later. The independent readers then see
//! every record exactly once in every sink, and nothing left behind.
//!
//! Membership chaos: three processes in static membership, then in Kafka-group membership, under SIGKILL and
//! SIGSTOP past the session, with a rescale (every process stopped, three started with the new count) halfway.
//!
//! Grey chaos: the same job with every link behind Toxiproxy (PostgreSQL: the checkpoint store, the leases, the
//! JDBC sink and the Iceberg catalog; Kafka: the source and the Kafka sink), hit by random faults: latency, a
//! silent blackhole, reset connections, on either link; SIGKILL and SIGSTOP of a process; and, in the long mode,
//! restarts of PostgreSQL and Kafka themselves. Every sink exactly once afterwards, nothing left behind.
//!
//! `RATCHET_MEMBERSHIP_CHAOS_FAULTS` sets the membership chaos's faults (4 by default, as CI runs it).
//! `RATCHET_CHAOS_KILLS` sets the number of kills (4 by default, as CI runs it; the long mode is hundreds: see
//! docs/benchmarks.md, "Chaos"), `RATCHET_GREY_CHAOS_FAULTS` the number of grey faults (6 by default, as CI runs
//! it), `RATCHET_GREY_CHAOS_RESTARTS=1` adds server restarts to them (they restart the shared test servers: not
//! in CI), `RATCHET_CHAOS_SEED` replays a run (the seed is printed). The two tests take turns (one heavy job at a
//! time on the machine).
#![allow(clippy::disallowed_methods)] // tests, benches and examples read the services' endpoints and their modes from the environment

mod common;

use std::time::{Duration, Instant};

use common::{Job, Rng, Worker, env_u64, seed};
use nix::sys::signal::Signal;
use test_support::Services;
use test_support::toxiproxy::Proxy;

/// One chaos test at a time: each runs a heavy job of several processes.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread")]
async fn random_sigkills_and_a_pause_leave_every_sink_exactly_once() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let kills = env_u64("RATCHET_CHAOS_KILLS").unwrap_or(4);
    let seed = seed();
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

/// How the chaos run's processes share the job.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Membership {
    /// `--member i --of 3`.
    Static,
    /// `membership = "kafka-group"`, `--member <name>`.
    KafkaGroup,
}

impl Membership {
    /// Process `i`'s arguments of three.
    fn args(self, i: usize) -> Vec<String> {
        match self {
            Membership::Static => vec!["--member".into(), i.to_string(), "--of".into(), "3".into()],
            Membership::KafkaGroup => vec!["--member".into(), format!("m{i}")],
        }
    }
}

/// Starts process `i` and waits until it runs the job (signals are handled from then on).
fn spawn_member(job: &mut Job, membership: Membership, i: usize) -> Worker {
    let args = membership.args(i);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let worker = job.spawn_worker(&args);
    worker.wait_logged("job starting", 1, Duration::from_secs(120));
    worker
}

#[tokio::test(flavor = "multi_thread")]
async fn static_members_under_kills_pauses_and_a_rescale_stay_exactly_once() {
    membership_chaos(Membership::Static).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn kafka_group_members_under_kills_pauses_and_a_rescale_stay_exactly_once() {
    membership_chaos(Membership::KafkaGroup).await;
}

/// Three processes of one membership mode, hit `RATCHET_MEMBERSHIP_CHAOS_FAULTS` times (4 by default) at random:
/// SIGKILL and a restart, or SIGSTOP past the session (the lease, 6 s) and SIGCONT; halfway, every process is
/// stopped and the job rescaled from 6 to 4 subtasks by three processes started with the new count at once (as
/// documented: the first rescales, the others find it done); records flow throughout. Every sink exactly once,
/// nothing left prepared or pending (the readers check).
async fn membership_chaos(membership: Membership) {
    let _turn = ONE_AT_A_TIME.lock().await;
    let faults = env_u64("RATCHET_MEMBERSHIP_CHAOS_FAULTS").unwrap_or(4);
    let seed = seed();
    eprintln!("membership chaos ({membership:?}): {faults} faults, RATCHET_CHAOS_SEED={seed}");
    let mut rng = Rng(seed);
    let mut job = Job::new("mchaos", 6, 6, "6s").await;
    if membership == Membership::KafkaGroup {
        job.edit_config(
            "lease = \"6s\"",
            "lease = \"6s\"\nmembership = \"kafka-group\"",
        );
    }
    let mut workers: Vec<Worker> = (0..3)
        .map(|i| spawn_member(&mut job, membership, i))
        .collect();
    job.produce(500).await;
    job.wait_delivered(Duration::from_secs(120));
    for fault in 0..faults {
        if fault == faults / 2 {
            // The rescale: every process stopped, then three started with the new count at once.
            for worker in &mut workers {
                worker.stop(Duration::from_secs(90));
            }
            job.edit_config("subtasks = 6", "subtasks = 4");
            workers = (0..3)
                .map(|i| spawn_member(&mut job, membership, i))
                .collect();
            eprintln!("rescaled to 4 subtasks");
        }
        job.produce(200 + rng.below(600)).await;
        tokio::time::sleep(Duration::from_millis(rng.below(1500))).await;
        let victim = rng.below(3) as usize;
        if rng.below(2) == 0 {
            workers[victim].kill9();
            workers[victim] = spawn_member(&mut job, membership, victim);
            eprintln!("fault {fault}: killed and restarted process {victim}");
        } else {
            workers[victim].signal(Signal::SIGSTOP);
            job.produce(100).await;
            tokio::time::sleep(Duration::from_secs(8)).await;
            workers[victim].signal(Signal::SIGCONT);
            eprintln!("fault {fault}: paused process {victim} for 8 s");
        }
    }
    job.produce(500).await;
    job.wait_delivered(Duration::from_secs(240));
    for worker in &mut workers {
        worker.stop(Duration::from_secs(90));
    }
    // One last run of the same mode recovers every subtask (what a paused process pre-committed after its
    // subtask's new owner recovered is removed there), then the readers check.
    let last = match membership {
        Membership::Static => vec!["--member", "0", "--of", "1", "--exit-when-idle", "2s"],
        Membership::KafkaGroup => vec!["--member", "last", "--exit-when-idle", "2s"],
    };
    job.spawn_worker(&last).wait_exit(Duration::from_secs(180));
    job.assert_exactly_once();
}

/// A link of the job to its servers, behind a proxy.
struct Link {
    name: &'static str,
    proxy: Proxy,
}

/// What the grey chaos does to the running job, one fault at a time.
#[derive(Debug)]
enum Fault {
    /// Every reply on the link delayed by this many milliseconds (jittered), for a while.
    Latency(&'static str, u64),
    /// Bytes on the link vanish, no connection closes, for this many milliseconds.
    Blackhole(&'static str, u64),
    /// Every open connection on the link is closed.
    Reset(&'static str),
    /// A process is killed with SIGKILL and replaced.
    Kill(usize),
    /// A process is stopped with SIGSTOP for this many milliseconds, then continued.
    Stop(usize, u64),
    /// The server behind the link is restarted (`scripts/services.sh down` then `up`).
    Restart(&'static str),
}

fn restart_service(service: &str) {
    let script = test_support::repo_root().join("scripts/services.sh");
    for command in ["down", "up"] {
        let status = std::process::Command::new(&script)
            .args([command, service])
            .status()
            .unwrap();
        assert!(
            status.success(),
            "services.sh {command} {service}: {status}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn random_grey_faults_on_every_link_leave_every_sink_exactly_once() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let faults = env_u64("RATCHET_GREY_CHAOS_FAULTS").unwrap_or(6);
    let restarts = std::env::var("RATCHET_GREY_CHAOS_RESTARTS").is_ok_and(|v| v == "1");
    let seed = seed();
    eprintln!(
        "grey chaos: {faults} faults (server restarts: {restarts}), RATCHET_CHAOS_SEED={seed}"
    );
    let mut rng = Rng(seed);
    let services = Services::get();
    let (kafka_bootstrap, kafka) = services.kafka_proxied().await;
    let pg = services
        .toxiproxy()
        .proxy("grey-chaos-pg", services.pg_host_port())
        .await;
    let mut job = Job::new("grey_chaos", 4, 4, "3s").await;
    // Every connection the workers open goes through a proxy; the test's producer and the readers do not.
    let text = std::fs::read_to_string(&job.config).unwrap();
    let text = text
        .replace(services.pg_host_port(), pg.address())
        .replace(
            &format!("bootstrap_servers = \"{}\"", services.kafka_bootstrap()),
            &format!("bootstrap_servers = \"{kafka_bootstrap}\""),
        )
        .replace(
            "lease = \"3s\"",
            "lease = \"3s\"\nmax_call_time = \"5s\"\nmax_recovery_time = \"30s\"\nmax_restarts = 1000",
        );
    std::fs::write(&job.config, text).unwrap();
    let links = [
        Link {
            name: "postgres",
            proxy: pg.clone(),
        },
        Link {
            name: "kafka",
            proxy: kafka.clone(),
        },
    ];
    let mut workers: Vec<Worker> = (0..3).map(|_| job.spawn_worker(&[])).collect();
    job.wait_spread(4, 3, Duration::from_secs(90));

    let started = Instant::now();
    let mut seen = std::collections::BTreeMap::<String, u32>::new();
    for _ in 0..faults {
        job.produce(200 + rng.below(800)).await;
        let on = links[rng.below(2) as usize].name;
        let fault = match rng.below(if restarts { 6 } else { 5 }) {
            0 => Fault::Latency(on, 100 + rng.below(400)),
            1 => Fault::Blackhole(on, 1000 + rng.below(7000)),
            2 => Fault::Reset(on),
            3 if rng.below(2) == 0 => Fault::Kill(rng.below(workers.len() as u64) as usize),
            3 => Fault::Stop(
                rng.below(workers.len() as u64) as usize,
                2000 + rng.below(6000),
            ),
            4 => Fault::Blackhole(on, 1000 + rng.below(3000)),
            _ => Fault::Restart(on),
        };
        let link = |name: &str| &links.iter().find(|l| l.name == name).expect("a link").proxy;
        eprintln!("grey chaos: {fault:?}");
        *seen
            .entry(format!("{fault:?}").split('(').next().unwrap().to_string())
            .or_default() += 1;
        match fault {
            Fault::Latency(name, millis) => {
                link(name).latency(millis, millis / 4).await;
                tokio::time::sleep(Duration::from_millis(2000 + rng.below(4000))).await;
                link(name).heal().await;
            }
            Fault::Blackhole(name, millis) => {
                link(name).blackhole().await;
                tokio::time::sleep(Duration::from_millis(millis)).await;
                link(name).heal().await;
            }
            Fault::Reset(name) => link(name).reset_connections().await,
            Fault::Kill(victim) => {
                workers[victim].kill9();
                workers[victim] = job.spawn_worker(&[]);
            }
            Fault::Stop(victim, millis) => {
                workers[victim].signal(Signal::SIGSTOP);
                tokio::time::sleep(Duration::from_millis(millis)).await;
                workers[victim].signal(Signal::SIGCONT);
            }
            Fault::Restart(name) => restart_service(name),
        }
        tokio::time::sleep(Duration::from_millis(rng.below(1500))).await;
    }
    job.produce(1000).await;
    eprintln!(
        "grey chaos: {faults} faults {seen:?} in {:?}, {} records",
        started.elapsed(),
        job.produced
    );
    job.wait_delivered(Duration::from_secs(300));
    for worker in &mut workers {
        worker.stop(Duration::from_secs(120));
    }
    let mut last = job.spawn_worker(&["--exit-when-idle", "2s"]);
    last.wait_exit(Duration::from_secs(180));
    job.assert_exactly_once();
    pg.delete().await;
}
