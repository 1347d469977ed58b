//! The worker's metrics, served in Prometheus's text format on `--metrics-listen` (`GET /metrics`), every series
//! labelled with the job's name. The Kafka-to-Kafka fast path reports the records, checkpoint and commit series as
//! subtask 0 (a checkpoint being one transaction), and the same final `stopped` line ([`log_stopped`]):
//!
//! | metric | type | labels | meaning |
//! |---|---|---|---|
//! | `ratchet_records_in_total` | counter | `subtask` | records read from Kafka and handed to the sinks |
//! | `ratchet_records_out_total` | counter | `subtask`, `sink` | rows written into a sink's open transaction |
//! | `ratchet_bytes_in_total` | counter | `subtask` | Arrow bytes of the decoded batches |
//! | `ratchet_checkpoints_total`, `ratchet_checkpoint_seconds`, `ratchet_commit_seconds`, `ratchet_pending_commit_age_seconds` | | `subtask` (and `sink`) | the protocol's metrics, recorded by the driver: [`connector_api::metrics`] |
//! | `ratchet_ignored_values_total` | counter | `sink`, `column` | values of columns a sink with `evolution = "ignore"` left out: [`connector_api::metrics`] |
//! | `ratchet_consumer_lag` | gauge | `subtask`, `partition` | high watermark minus the next offset to read |
//! | `ratchet_source_partitions` | gauge | `subtask` | partitions the subtask reads (grows when the topic gets new ones) |
//! | `ratchet_source_gap_records_total` | counter | `subtask`, `partition` | offsets removed from the log before they were read, skipped with `on_gap = "earliest"` |
//! | `ratchet_subtask_restarts_total` | counter | `subtask` | subtask runs that failed and were restarted |
//! | `ratchet_dead_letters_total` | counter | `subtask` | records sent to the dead-letter topic |
//! | `ratchet_tombstones_total` | counter | `subtask`, `sink`, `outcome` | tombstones of the JSON and Avro decodings (null values) `written` as deletions (Kafka sink) or `skipped` by a sink that cannot express one |
//! | `ratchet_subtasks_running` | gauge | | subtasks this process runs |

use anyhow::{Context, Result};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Records read.
pub const RECORDS_IN: &str = "ratchet_records_in_total";
/// Rows written per sink.
pub const RECORDS_OUT: &str = "ratchet_records_out_total";
/// Decoded bytes read.
pub const BYTES_IN: &str = "ratchet_bytes_in_total";
/// Consumer lag per partition.
pub const CONSUMER_LAG: &str = "ratchet_consumer_lag";
/// Partitions a subtask reads.
pub const SOURCE_PARTITIONS: &str = "ratchet_source_partitions";
/// Offsets skipped over gaps (`on_gap = "earliest"`).
pub const SOURCE_GAP_RECORDS: &str = "ratchet_source_gap_records_total";
/// Records sent to the dead-letter topic.
pub const DEAD_LETTERS: &str = "ratchet_dead_letters_total";
/// Tombstones written or skipped per sink.
pub const TOMBSTONES: &str = "ratchet_tombstones_total";
/// Subtask restarts.
pub const RESTARTS: &str = "ratchet_subtask_restarts_total";
/// Subtasks running here.
pub const SUBTASKS_RUNNING: &str = "ratchet_subtasks_running";

/// Seconds buckets from 1 ms to 2 min.
const BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0,
];

/// Records every metric from now on, labelled `job = <job>`; the handle renders them for `GET /metrics`
/// ([`crate::ops::health::serve`]).
///
/// # Errors
/// A recorder is already installed.
pub fn install(job: &str) -> Result<PrometheusHandle> {
    PrometheusBuilder::new()
        .add_global_label("job", job)
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), BUCKETS)
        .context("invalid histogram buckets")?
        .install_recorder()
        .context("cannot install the metrics recorder")
}

/// Logs the line a run ends with, the same for the driver path and the Kafka-to-Kafka fast path: records,
/// checkpoints (the fast path: transactions), when the first and last record were read (Unix ms; 0: none), this
/// process's CPU seconds and peak RSS. The benchmarks compute their rates from it.
pub fn log_stopped(
    records: u64,
    checkpoints: u64,
    first_record: Option<std::time::SystemTime>,
    last_record: Option<std::time::SystemTime>,
) {
    let unix_ms = |at: Option<std::time::SystemTime>| {
        at.and_then(|at| at.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_millis() as u64)
    };
    let (cpu_seconds, peak_rss_kb) = own_usage();
    tracing::info!(
        records,
        checkpoints,
        first_record_unix_ms = unix_ms(first_record),
        last_record_unix_ms = unix_ms(last_record),
        cpu_seconds,
        peak_rss_kb,
        "stopped"
    );
}

/// CPU seconds (user + system) and peak RSS (KiB) of this process so far.
fn own_usage() -> (f64, i64) {
    use nix::sys::resource::{UsageWho, getrusage};
    match getrusage(UsageWho::RUSAGE_SELF) {
        Ok(usage) => {
            let seconds = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
            (
                seconds(usage.user_time()) + seconds(usage.system_time()),
                usage.max_rss(),
            )
        }
        Err(_) => (0.0, 0),
    }
}
