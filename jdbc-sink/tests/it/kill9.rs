//! Real `kill -9`s on PostgreSQL and MariaDB, in xa and upsert mode.
//!
//! At every protocol step, through the conformance kit's runner ([`KillNine`]): a child process runs one
//! subtask and SIGKILLs itself at the step; the parent recovers and the independent verifier (psycopg / pymysql)
//! must see exactly the restored checkpoint's records, each once (an upsert table may also show the rows its
//! pre-commit applied before the kill, once each), and no prepared transaction of the sink; then the job goes on
//! and a final recovery leaves every record once.
//!
//! Then between the durable checkpoint record and `COMMIT PREPARED` / `XA COMMIT` with three subtasks writing
//! into one table, and a restart with the same number of subtasks and one with two. A child process runs the
//! three subtasks (each its own driver, checkpoint directory and partition of the source) and SIGKILLs itself
//! right after one of them made checkpoint 4's record durable. The parent then:
//!
//! 1. checks with the verifier that a prepared transaction of the sink is on the server (the crash left one to
//!    commit);
//! 2. restarts: with two subtasks, the vanished subtask 2 is recovered first from its own checkpoint directory
//!    (committing its durable checkpoint, rolling back the rest) and its partition is resumed by subtask 0 from
//!    the position that recovery restored;
//! 3. runs every partition to its end, and checks that every source record is in the table exactly once and no
//!    prepared transaction of the sink is left.
//!
//! The upsert mode gets the same runs, killed right after a pre-commit applied its rows (before the record is
//! durable): the replay writes them again, and every record is still there exactly once.

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;

use async_trait::async_trait;
use common::{Db, read, short_name, sink_driver};
use connector_api::{Driver, LocalCheckpointStore, Result, SinkHandle, SinkId, SourceOffset, Step};
use jdbc_sink::{JdbcSink, WriteMode};
use ratchet_conformance::conformance_batch;
use ratchet_conformance::kill9::{KillNine, KillTarget, KilledRun, kill_at};

/// One subtask killed at every step (the child reads the run from `RATCHET_JDBC_KILL9_STEP_CHILD`).
const KILL9: KillNine = KillNine::new("kill9::child", "RATCHET_JDBC_KILL9_STEP_CHILD");
/// The same for the upsert mode, whose rows are visible from pre-commit on.
const KILL9_UPSERT: KillNine = KillNine {
    visible_at_pre_commit: true,
    ..KILL9
};

/// The JDBC sink in one mode on one database, writing a table named after the run.
struct Table {
    db: Db,
    mode: Mode,
}

impl Table {
    /// `<pg|mysql>-<xa|upsert>`.
    fn of(variant: &str) -> Table {
        let (db, mode) = variant.split_once('-').expect("`<db>-<mode>`");
        Table {
            db: db_of(db),
            mode: Mode::parse(mode),
        }
    }

    fn names(run: &KilledRun) -> (String, String) {
        let table = short_name("kill9_", &[&run.name]);
        let scope = short_name("k", &[&table]);
        (table, scope)
    }

    /// Committed ids, and the prepared transactions of the run's scope.
    async fn read(&self, run: &KilledRun) -> (Vec<i64>, Vec<String>) {
        let (db, (table, scope)) = (self.db, Table::names(run));
        tokio::task::spawn_blocking(move || read(db, &table, &[&scope]))
            .await
            .expect("the verifier's task")
    }
}

#[async_trait]
impl KillTarget for Table {
    type Sink = JdbcSink;

    async fn create_sink(&self, run: &KilledRun) -> Result<JdbcSink> {
        let (table, scope) = Table::names(run);
        JdbcSink::new(common::config(
            self.db,
            &sink_id(),
            0,
            &table,
            &scope,
            self.mode.write_mode(),
        ))
        .await
    }

    async fn visible_ids(&self, run: &KilledRun) -> Result<Vec<i64>> {
        Ok(self.read(run).await.0)
    }

    async fn leftovers(&self, run: &KilledRun) -> Result<Vec<String>> {
        Ok(self.read(run).await.1)
    }
}

/// The entry point of the runner's child (returns at once in a normal test run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child() {
    if let Some(run) = KILL9.child_run() {
        KILL9.run_child(&Table::of(&run.variant), run).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_kill_9_at_every_step() {
    KILL9.every_step(&Table::of("pg-xa"), "pg-xa").await;
    KILL9_UPSERT
        .every_step(&Table::of("pg-upsert"), "pg-upsert")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_kill_9_at_every_step() {
    KILL9.every_step(&Table::of("mysql-xa"), "mysql-xa").await;
    KILL9_UPSERT
        .every_step(&Table::of("mysql-upsert"), "mysql-upsert")
        .await;
}

/// Set in the child: `<pg|mysql>;<table>;<scope>;<state dir>`.
const CHILD: &str = "RATCHET_JDBC_KILL9_CHILD";
/// Subtasks of the killed run; partition `p` of the source is owned by subtask `p % subtasks`.
const SUBTASKS: u32 = 3;
/// Records per partition, rows per batch, batches per checkpoint.
const RECORDS: i64 = 2_000;
const ROWS: i64 = 40;
const BATCHES: i64 = 2;
/// The checkpoint whose durable record the child dies after (the start consumes id 1).
const CRASH_CHECKPOINT: u64 = 4;

fn sink_id() -> SinkId {
    SinkId::new("orders-db").unwrap()
}

/// Record `offset` of partition `partition`: ids are unique across partitions.
fn id(partition: u32, offset: i64) -> i64 {
    i64::from(partition) * 1_000_000 + offset
}

fn db_of(kind: &str) -> Db {
    match kind {
        "pg" => Db::Postgres,
        _ => Db::MariaDb,
    }
}

/// The sink's mode in a run, and the step the child dies at: xa right after the durable record, before
/// `COMMIT PREPARED` / `XA COMMIT`; upsert right after its pre-commit applied the rows, before the record is durable
/// (the replay applies them again).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Xa,
    Upsert,
}

impl Mode {
    fn parse(name: &str) -> Mode {
        match name {
            "xa" => Mode::Xa,
            _ => Mode::Upsert,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Mode::Xa => "xa",
            Mode::Upsert => "upsert",
        }
    }

    fn write_mode(self) -> WriteMode {
        match self {
            Mode::Xa => WriteMode::Xa,
            Mode::Upsert => WriteMode::Upsert {
                key: vec!["id".into()],
            },
        }
    }

    fn kill_step(self) -> Step {
        match self {
            Mode::Xa => Step::AfterRecordDurable,
            Mode::Upsert => Step::AfterPreCommit,
        }
    }
}

/// A driver for `subtask` over its own checkpoint directory under `state`, with the JDBC sink in `mode`.
async fn driver(
    db: Db,
    mode: Mode,
    table: &str,
    scope: &str,
    state: &Path,
    subtask: u32,
) -> (Driver<LocalCheckpointStore>, SinkHandle) {
    let dir = state.join(subtask.to_string());
    sink_driver(
        db,
        &sink_id(),
        subtask,
        table,
        scope,
        &dir,
        mode.write_mode(),
    )
    .await
}

/// Writes the given partitions from their positions to `until` (exclusive), `BATCHES` batches per checkpoint
/// and partition, checkpointing after each round.
async fn run_partitions(
    driver: &mut Driver<LocalCheckpointStore>,
    sink: SinkHandle,
    positions: &mut BTreeMap<u32, i64>,
    until: i64,
) {
    while positions.values().any(|next| *next < until) {
        for (partition, next) in positions.iter_mut() {
            for _ in 0..BATCHES {
                let end = (*next + ROWS).min(until);
                if end > *next {
                    driver
                        .write(
                            sink,
                            &conformance_batch(id(*partition, *next)..id(*partition, end)),
                        )
                        .await
                        .unwrap();
                    *next = end;
                }
            }
        }
        let offsets = positions
            .iter()
            .map(|(partition, next)| SourceOffset::new("source", *partition as i32, *next))
            .collect();
        driver.checkpoint(offsets).await.unwrap();
    }
}

/// The positions a restored checkpoint holds, per partition.
fn restored_positions(positions: &[SourceOffset]) -> BTreeMap<u32, i64> {
    positions
        .iter()
        .map(|p| (p.partition as u32, p.next_offset))
        .collect()
}

/// Entry point of the child process (does nothing in a normal test run): three subtasks until one of them dies
/// after checkpoint 4's record is durable, before its commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_process_entry_point() {
    let Ok(spec) = std::env::var(CHILD) else {
        return;
    };
    let parts: Vec<&str> = spec.splitn(5, ';').collect();
    let (db, mode, table, scope) = (db_of(parts[0]), Mode::parse(parts[1]), parts[2], parts[3]);
    let state = Path::new(parts[4]);
    let mut subtasks = Vec::new();
    for subtask in 0..SUBTASKS {
        let (driver, sink) = driver(db, mode, table, scope, state, subtask).await;
        subtasks.push(async move {
            let mut driver =
                driver.with_fault_injector(kill_at(mode.kill_step(), CRASH_CHECKPOINT));
            driver.start().await.unwrap();
            let mut positions = BTreeMap::from([(subtask, 0)]);
            // Far more than the crash needs: the process dies at checkpoint 4.
            run_partitions(&mut driver, sink, &mut positions, RECORDS).await;
            panic!("subtask {subtask} finished without the crash");
        });
    }
    futures_util::future::join_all(subtasks).await;
}

async fn kill_then_restart_with(kind: &str, mode: Mode, restart_subtasks: u32) {
    let db = db_of(kind);
    let label = format!(
        "{kind} {}, restart with {restart_subtasks} subtasks",
        mode.name()
    );
    let table = short_name("kill9_", &[&label, &test_support::unique_name("t")]);
    let scope = short_name("k", &[&table]);
    let state = tempfile::tempdir().unwrap();
    ratchet_conformance::kill9::run_killed_child(
        "kill9::child_process_entry_point",
        CHILD,
        &format!(
            "{kind};{};{table};{scope};{}",
            mode.name(),
            state.path().display()
        ),
    );

    let (before, prepared) = {
        let (table, scope) = (table.clone(), scope.clone());
        tokio::task::spawn_blocking(move || read(db, &table, &[&scope]))
            .await
            .unwrap()
    };
    assert!(
        mode != Mode::Xa || !prepared.is_empty(),
        "{label}: the crash after a durable record should leave its transaction prepared"
    );

    // Subtasks that no longer exist: recover each from its own checkpoint directory, keep its positions.
    let mut handed_over = BTreeMap::new();
    for vanished in restart_subtasks..SUBTASKS {
        let (mut driver, _) = driver(db, mode, &table, &scope, state.path(), vanished).await;
        let restored = driver.start().await.unwrap();
        driver.close().await.unwrap();
        handed_over.extend(restored_positions(&restored.positions));
    }
    // The remaining subtasks resume their own partitions and those handed over to them.
    let mut runs = Vec::new();
    for subtask in 0..restart_subtasks {
        let (mut driver, sink) = driver(db, mode, &table, &scope, state.path(), subtask).await;
        let restored = driver.start().await.unwrap();
        let mut positions = restored_positions(&restored.positions);
        // Every partition this subtask owns now: from its own record, the vanished owner's, or the start (an
        // owner that never checkpointed before the kill has no position to hand over).
        for partition in (0..SUBTASKS).filter(|p| p % restart_subtasks == subtask) {
            let handed = handed_over.get(&partition).copied();
            let own = positions.get(&partition).copied();
            positions.insert(partition, handed.or(own).unwrap_or(0));
        }
        runs.push(async move {
            run_partitions(&mut driver, sink, &mut positions, RECORDS).await;
            driver.close().await.unwrap();
        });
    }
    futures_util::future::join_all(runs).await;

    let (mut ids, prepared) = tokio::task::spawn_blocking(move || read(db, &table, &[&scope]))
        .await
        .unwrap();
    ids.sort_unstable();
    let expected: Vec<i64> = (0..SUBTASKS)
        .flat_map(|p| (0..RECORDS).map(move |o| id(p, o)))
        .collect();
    assert!(
        ids == expected,
        "{label}: {} rows visible (before the restart: {}), expected {} each once",
        ids.len(),
        before.len(),
        expected.len()
    );
    assert!(
        prepared.is_empty(),
        "{label}: prepared transactions left: {prepared:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_kill_9_before_commit_prepared_then_restart() {
    if std::env::var(CHILD).is_ok() {
        return;
    }
    kill_then_restart_with("pg", Mode::Xa, SUBTASKS).await;
    kill_then_restart_with("pg", Mode::Xa, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_kill_9_after_upsert_pre_commit_then_restart() {
    if std::env::var(CHILD).is_ok() {
        return;
    }
    kill_then_restart_with("pg", Mode::Upsert, SUBTASKS).await;
    kill_then_restart_with("pg", Mode::Upsert, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_kill_9_before_xa_commit_then_restart() {
    if std::env::var(CHILD).is_ok() {
        return;
    }
    kill_then_restart_with("mysql", Mode::Xa, SUBTASKS).await;
    kill_then_restart_with("mysql", Mode::Xa, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_kill_9_after_upsert_pre_commit_then_restart() {
    if std::env::var(CHILD).is_ok() {
        return;
    }
    kill_then_restart_with("mysql", Mode::Upsert, SUBTASKS).await;
    kill_then_restart_with("mysql", Mode::Upsert, 2).await;
}
