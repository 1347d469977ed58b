//! Real `kill -9` at every protocol step, on local disk and on SeaweedFS S3: a child process runs a job and sends
//! itself SIGKILL at the step; the parent then recovers (a new driver and sink), and checks with the Python
//! verifier that exactly the restored checkpoint's records are visible, each once, and that no in-progress file,
//! spill file, staged object or open multipart upload is left.

use crate::common;

use std::path::PathBuf;

use arrow_array::RecordBatch;
use common::{Place, config};
use connector_api::{Driver, DriverConfig, LocalCheckpointStore, SinkId, Step};
use file_sink::{FileSink, FileSinkConfig, FormatConfig};
use integration::conformance::conformance_batch_with;
use integration::crash::{KILL_STEPS, durable_before, run_killed_child, run_until_killed};

/// Set in the child: `<local|s3>;<local dir or S3 prefix>;<checkpoint dir>;<step>`.
const CHILD: &str = "RATCHET_KILL9_CHILD";
/// Rows per batch and batches per checkpoint: ~9 MB of JSON per checkpoint, so S3 files go multipart and a
/// part is uploaded before the checkpoint ends.
const ROWS: i64 = 3000;
const BATCHES: i64 = 3;
/// The checkpoint the child dies in (the start consumes id 1; 2 and 3 complete first).
const CRASH_CHECKPOINT: u64 = 4;

fn sink_id() -> SinkId {
    SinkId::new("killed").unwrap()
}

fn rows(ids: std::ops::Range<i64>) -> RecordBatch {
    conformance_batch_with(ids, |i| format!("{i:0>1000}"))
}

fn sink_config(place: &Place) -> FileSinkConfig {
    let mut config = config(place, "job", &sink_id());
    config.format = FormatConfig::JsonLines;
    config
}

/// The child's job: checkpoints of `BATCHES` x `ROWS` records until it kills itself at `step` of checkpoint 4.
async fn child_job(place: Place, checkpoints: PathBuf, step: String) {
    let mut driver = Driver::new(
        LocalCheckpointStore::open(&checkpoints, 3).unwrap(),
        DriverConfig::default(),
    );
    let sink = driver
        .add_sink(FileSink::new(sink_config(&place)).await.unwrap())
        .unwrap();
    run_until_killed(
        driver,
        sink,
        Step::parse(&step).expect("a kill step"),
        CRASH_CHECKPOINT,
        BATCHES,
        ROWS,
        rows,
    )
    .await
}

/// Entry point of the child process (does nothing in a normal test run).
#[tokio::test]
async fn child_process_entry_point() {
    let Ok(spec) = std::env::var(CHILD) else {
        return;
    };
    let parts: Vec<&str> = spec.splitn(4, ';').collect();
    let place = match parts[0] {
        "local" => Place::Local(PathBuf::from(parts[1])),
        _ => Place::S3 {
            prefix: parts[1].to_string(),
        },
    };
    child_job(place, PathBuf::from(parts[2]), parts[3].to_string()).await;
}

async fn kill_at_every_step(place: Place, label: &str) {
    for step in KILL_STEPS {
        let state = tempfile::tempdir().unwrap();
        // Each step gets its own destination within the place.
        let place = match &place {
            Place::Local(dir) => Place::Local(dir.join(step.name())),
            Place::S3 { prefix } => Place::S3 {
                prefix: format!("{prefix}/{step}"),
            },
        };
        let (kind, location) = match &place {
            Place::Local(dir) => ("local", dir.display().to_string()),
            Place::S3 { prefix } => ("s3", prefix.clone()),
        };
        run_killed_child(
            "kill9::child_process_entry_point",
            CHILD,
            &format!("{kind};{location};{};{step}", state.path().display()),
        );

        if step != Step::AfterCommit {
            // The crash left staged data behind: the test below is about recovery cleaning it up.
            let before = place.clone();
            let (_, _, strays) = tokio::task::spawn_blocking(move || before.read("job", "id"))
                .await
                .unwrap();
            assert!(
                !strays.is_empty(),
                "{label} {step}: expected staged leftovers before recovery"
            );
        }

        let mut driver = Driver::new(
            LocalCheckpointStore::open(state.path(), 3).unwrap(),
            DriverConfig::default(),
        );
        driver
            .add_sink(FileSink::new(sink_config(&place)).await.unwrap())
            .unwrap();
        let restored = driver.start().await.unwrap();
        driver.close().await.unwrap();
        let upto = restored.positions.first().map_or(0, |p| p.next_offset);
        let durable = durable_before(step, CRASH_CHECKPOINT) as i64;
        assert_eq!(
            upto,
            durable * BATCHES * ROWS,
            "{label} {step}: restored position"
        );

        let (mut ids, _, strays) = tokio::task::spawn_blocking(move || place.read("job", "id"))
            .await
            .unwrap();
        ids.sort_unstable();
        assert_eq!(
            ids,
            (0..upto).collect::<Vec<_>>(),
            "{label} {step}: visible records"
        );
        assert!(
            strays.is_empty(),
            "{label} {step}: left behind after recovery: {strays:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_at_every_step_on_local_disk() {
    if std::env::var(CHILD).is_ok() {
        return;
    }
    let (place, _dir) = Place::local();
    kill_at_every_step(place, "local").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_at_every_step_on_s3() {
    if std::env::var(CHILD).is_ok() {
        return;
    }
    kill_at_every_step(Place::s3("kill9"), "s3").await;
}
