//! Changing a job's subtask count: 2 -> 3 (by `ratchet rescale`, killed with SIGKILL after each step before the
//! switch, then by `ratchet run` killed right after it) -> 1 (by `ratchet rescale`), with records produced between
//! every step and a worker killed mid-checkpoint before each change. Every record lands once in all four sinks
//! (the independent readers), nothing is left open or prepared, no old layout's checkpoint record stays, and
//! `inspect` lists the layout history. On the PostgreSQL store and on the local store (the default). The same with
//! every sink routed by topic over two topics, and with kills at random moments within a rescale.

use crate::common;

use std::collections::BTreeMap;
use std::ops::Range;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Output};
use std::time::Duration;

use common::{Job, Rng, create_topic, env_u64, seed};
use test_support::Services;

use crate::topics::{assert_each_topic_once, route_every_sink, wait_copied};

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

/// Which checkpoint store a test runs on.
#[derive(Clone, Copy, PartialEq)]
enum Store {
    Postgres,
    Local,
}

impl Store {
    fn name(self) -> &'static str {
        match self {
            Store::Postgres => "PostgreSQL store",
            Store::Local => "local store",
        }
    }
}

/// A job on `store` (the helper's job file uses the PostgreSQL store).
async fn job_on(store: Store, prefix: &str, partitions: i32, subtasks: u32) -> Job {
    let job = Job::new(prefix, partitions, subtasks, "3s").await;
    if store == Store::Local {
        job.store_locally();
    }
    job
}

/// The job's store keys (layout generations) that hold checkpoint records, in order.
fn keys_with_records(job: &Job, store: Store) -> Vec<String> {
    match store {
        Store::Postgres => Services::get()
            .psql(&format!(
                "select job from ratchet_checkpoint_records where job like '{}%' group by job order by job",
                job.name
            ))
            .lines()
            .map(str::to_string)
            .collect(),
        Store::Local => {
            let mut keys: Vec<String> = std::fs::read_dir(job.state_dir())
                .unwrap()
                .map(|e| e.unwrap().path())
                .filter(|dir| {
                    std::fs::read_dir(dir).unwrap().any(|e| {
                        let e = e.unwrap();
                        e.file_name().to_string_lossy().starts_with("subtask-")
                            && std::fs::read_dir(e.path()).unwrap().any(|f| {
                                f.unwrap()
                                    .file_name()
                                    .to_string_lossy()
                                    .starts_with("checkpoint-")
                            })
                    })
                })
                .map(|dir| dir.file_name().unwrap().to_string_lossy().to_string())
                .collect();
            keys.sort();
            keys
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn rescaling_two_to_three_to_one_survives_a_kill_at_every_step() {
    rescale_two_to_three_to_one(Store::Postgres).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn rescaling_on_the_local_store_survives_a_kill_at_every_step() {
    rescale_two_to_three_to_one(Store::Local).await;
}

async fn rescale_two_to_three_to_one(store: Store) {
    let mut job = job_on(store, "rescale", 6, 2).await;
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
    // Killed after its new records: they stay unused until a start with the old count discards them.
    let abandoned = format!("{}@1", job.name);
    assert!(
        keys_with_records(&job, store).contains(&abandoned),
        "the killed rescale wrote {abandoned}'s records"
    );
    set_subtasks(&job, 3, 2);
    job.spawn_worker(&["--exit-when-idle", "2s"])
        .wait_exit(Duration::from_secs(120));
    assert_eq!(
        keys_with_records(&job, store),
        vec![job.name.clone()],
        "a start discards what a rescale killed before its switch wrote"
    );
    set_subtasks(&job, 2, 3);
    // `run` rescales first; killed right after the switch, before the old layout's records are retired.
    job.spawn_worker_with_env(&[], &[("RATCHET_RESCALE_KILL_AT", "after-switch")])
        .wait_killed(Duration::from_secs(120));
    assert!(
        keys_with_records(&job, store).contains(&job.name),
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
        keys_with_records(&job, store),
        vec![format!("{}@2", job.name)],
        "only the current layout's records stay"
    );
}

/// A job whose every sink is routed by topic, over two topics: 2 -> 3 by `run` (after a `rescale` killed past
/// its new records), then 3 -> 1 by `rescale`, with workers killed mid-checkpoint between the changes. Each
/// topic's records land once in its own directory, Kafka topic, PostgreSQL table and Iceberg table: the routed
/// instances' decided work is committed by the resolve and their positions dealt to the new subtasks.
#[tokio::test(flavor = "multi_thread")]
async fn rescaling_routed_sinks_over_several_topics_on_postgres() {
    rescale_routed_sinks(Store::Postgres).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn rescaling_routed_sinks_over_several_topics_on_the_local_store() {
    rescale_routed_sinks(Store::Local).await;
}

async fn rescale_routed_sinks(store: Store) {
    let mut job = job_on(store, "rescale-routed", 2, 2).await;
    let name = job.name.clone();
    let (first, more) = (job.topic.clone(), format!("{name}-more"));
    create_topic(&more, 3).await;
    for topic in [&first, &more] {
        create_topic(&format!("{name}-copy-{topic}"), 2).await;
    }
    route_every_sink(&job, &format!("{name}-(in|more)"));
    let mut sent: BTreeMap<String, Vec<Range<i64>>> = BTreeMap::new();
    let mut produce = async |job: &mut Job, count: u64| {
        for topic in [&first, &more] {
            let from = job.produced as i64;
            job.produce_into(topic, count).await;
            sent.entry(topic.to_string())
                .or_default()
                .push(from..job.produced as i64);
        }
    };
    produce(&mut job, 400).await;
    let mut worker = job.spawn_worker(&[]);
    wait_copied(&format!("{name}-copy-{more}"), 400);
    produce(&mut job, 200).await;
    worker.kill9();

    set_subtasks(&job, 2, 3);
    let out = rescale(&job, 3, Some("after-new-records"));
    assert_eq!(out.status.signal(), Some(9), "{}", said(&out));
    produce(&mut job, 100).await;
    // `run` rescales first, then runs the three subtasks with every topic's instances.
    let mut worker = job.spawn_worker(&[]);
    wait_copied(&format!("{name}-copy-{first}"), 700);
    produce(&mut job, 100).await;
    worker.kill9();

    let out = rescale(&job, 1, None);
    assert!(
        out.status.success() && said(&out).contains("rescaled from 3 to 1 subtasks"),
        "{}",
        said(&out)
    );
    set_subtasks(&job, 3, 1);
    produce(&mut job, 100).await;
    job.spawn_worker(&["--exit-when-idle", "2s"])
        .wait_exit(Duration::from_secs(120));
    assert_each_topic_once(&job, &sent);
    assert_eq!(recorded_count(&job), 1, "{}", store.name());
}

/// Two processes started at once with a new count (a rolling update): one rescales while the other waits for it,
/// then both run the new layout; one change in the history, every record once. (The local store serves one
/// process: a second is refused, which `liveness` tests.)
#[tokio::test(flavor = "multi_thread")]
async fn two_processes_starting_with_a_new_count_rescale_once() {
    two_processes_rescale_once(Store::Postgres).await;
}

async fn two_processes_rescale_once(store: Store) {
    let mut job = job_on(store, "rescale2", 4, 2).await;
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

#[tokio::test(flavor = "multi_thread")]
async fn rescaling_killed_at_random_moments_keeps_one_whole_layout_on_postgres() {
    killed_at_random_moments(Store::Postgres).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn rescaling_killed_at_random_moments_keeps_one_whole_layout_on_the_local_store() {
    killed_at_random_moments(Store::Local).await;
}

/// `ratchet rescale` between 2 and 3 subtasks, killed with SIGKILL after a random delay (anywhere within three times
/// what a whole rescale took: the later attempts wait for a killed one's leases; not only at the drill points) `RATCHET_RESCALE_KILLS` times (6 by default), records produced between attempts:
/// after every kill the store holds one whole layout (the old one or the new one: `check-config` reads it), and a
/// final run over the layout the store records delivers every record once.
async fn killed_at_random_moments(store: Store) {
    let kills = env_u64("RATCHET_RESCALE_KILLS").unwrap_or(6);
    let seed = seed();
    eprintln!(
        "rescale under kills ({}): {kills} kills, RATCHET_CHAOS_SEED={seed}",
        store.name()
    );
    let mut rng = Rng(seed);
    let mut job = job_on(store, "rescalek", 6, 2).await;
    job.produce(300).await;
    job.spawn_worker(&["--exit-when-idle", "2s"])
        .wait_exit(Duration::from_secs(120));
    // One whole rescale, timed: the kills land anywhere within that long.
    let started = std::time::Instant::now();
    let out = rescale(&job, 3, None);
    let took = started.elapsed();
    assert!(out.status.success(), "{}", said(&out));
    eprintln!("a whole rescale took {took:?}");
    job.produce(100).await;
    let mut recorded = 3;
    for attempt in 0..kills {
        let to = if recorded == 2 { 3 } else { 2 };
        let mut rescaler = Command::new(env!("CARGO_BIN_EXE_ratchet"))
            .args(["rescale", "--to", &to.to_string(), "--config"])
            .arg(&job.config)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let delay = Duration::from_millis(rng.below(took.as_millis() as u64 * 3 + 1));
        tokio::time::sleep(delay).await;
        let ended = rescaler.try_wait().unwrap();
        if let Some(status) = ended {
            assert!(
                status.success(),
                "attempt {attempt}: the rescale failed: {status}"
            );
        }
        let finished = ended.is_some();
        let _ = rescaler.kill();
        rescaler.wait().unwrap();
        // Whatever the moment, one whole layout, the old or the new one, and a store check-config can read.
        let count = recorded_count(&job);
        assert!(
            count == recorded || count == to,
            "attempt {attempt} (killed after {delay:?}): the store records {count} subtasks, neither {recorded} \
             nor {to}"
        );
        assert!(
            !finished || count == to,
            "attempt {attempt}: the rescale ended on its own but the layout stayed at {recorded}"
        );
        eprintln!(
            "attempt {attempt}: {} after {delay:?}, layout at {count} subtask(s)",
            if finished { "ended" } else { "killed" }
        );
        recorded = count;
        job.produce(100).await;
    }
    set_subtasks(&job, 2, recorded);
    job.spawn_worker(&["--exit-when-idle", "2s"])
        .wait_exit(Duration::from_secs(180));
    job.assert_exactly_once();
    assert_eq!(
        keys_with_records(&job, store).len(),
        1,
        "one layout's records stay: {:?}",
        keys_with_records(&job, store)
    );
}

/// The subtask count the store records, as `check-config` reports it (which must pass).
fn recorded_count(job: &Job) -> u32 {
    let out = job.ratchet("check-config");
    let text = said(&out);
    assert!(
        out.status.success() && text.contains("ready to run"),
        "{text}"
    );
    let count = |line: &str| -> Option<u32> {
        if let Some((before, _)) = line.split_once(" subtask(s), as the store records") {
            return before.rsplit(' ').next()?.parse().ok();
        }
        line.split_once("the store records ")?
            .1
            .split(' ')
            .next()?
            .parse()
            .ok()
    };
    text.lines()
        .find_map(count)
        .unwrap_or_else(|| panic!("check-config does not say the recorded count:\n{text}"))
}
