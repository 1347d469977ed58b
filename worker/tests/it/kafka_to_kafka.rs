//! `[job] kafka_to_kafka = true`: the fast path (source offsets inside each Kafka transaction) through
//! `ratchet run`, killed with SIGKILL while copying, restarted, and stopped with SIGTERM: the read_committed
//! verifier sees every record once in the target topic, and no open transaction; it reports the driver path's
//! metrics and final line.

use crate::common;

use std::time::{Duration, Instant};

use common::{Job, free_port, scrape, total};
use test_support::Services;

#[tokio::test(flavor = "multi_thread")]
async fn the_fast_path_copies_exactly_once_across_a_sigkill() {
    let services = Services::get();
    let mut job = Job::new("k2k", 3, 1, "3s").await;
    std::fs::write(
        &job.config,
        format!(
            r#"
[job]
name = "{name}"
checkpoint_interval = "500ms"
kafka_to_kafka = true

[source]
bootstrap_servers = "{bootstrap}"
topic = "{topic}"

[[sinks]]
type = "kafka"
id = "copy"
bootstrap_servers = "{bootstrap}"
topic = "{copy}"
transactional_id_prefix = "{copy}"
"#,
            name = job.name,
            bootstrap = services.kafka_bootstrap(),
            topic = job.topic,
            copy = job.copy_topic,
        ),
    )
    .unwrap();
    job.produce(5000).await;
    let mut worker = job.spawn_worker(&[]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while services
        .kafka_ids(services.kafka_bootstrap(), &job.copy_topic)
        .0
        .is_empty()
    {
        assert!(
            Instant::now() < deadline,
            "nothing copied:\n{}",
            worker.log_text()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(
        worker.log_text().contains("fast path"),
        "{}",
        worker.log_text()
    );
    job.produce(5000).await;
    worker.kill9();

    let port = free_port();
    let mut worker = job.spawn_worker(&["--metrics-listen", &format!("127.0.0.1:{port}")]);
    job.produce(2000).await;
    job.wait_delivered(Duration::from_secs(90));
    // The same series and final line as the driver path: records, checkpoints (transactions) and their times.
    let body = scrape(port).unwrap_or_default();
    for metric in [
        "ratchet_records_in_total",
        "ratchet_records_out_total",
        "ratchet_checkpoints_total",
        "ratchet_commit_seconds_count",
    ] {
        assert!(total(&body, metric) > 0.0, "{metric} missing:\n{body}");
    }
    worker.stop(Duration::from_secs(60));
    let stopped = worker
        .log_text()
        .lines()
        .find(|l| l.contains(" stopped "))
        .map(str::to_string)
        .unwrap_or_default();
    for field in [
        "records=",
        "checkpoints=",
        "first_record_unix_ms=",
        "cpu_seconds=",
        "peak_rss_kb=",
    ] {
        assert!(
            stopped.contains(field),
            "the stopped line lacks {field}: {stopped:?}"
        );
    }
    assert!(!stopped.contains("first_record_unix_ms=0 "), "{stopped}");

    let (ids, partitions) = services.kafka_ids(services.kafka_bootstrap(), &job.copy_topic);
    assert_eq!(ids, (0..12_000).collect::<Vec<i64>>());
    for (p, offsets) in partitions.as_object().unwrap() {
        assert_eq!(
            offsets["lso"], offsets["high_watermark"],
            "open transaction on {p}"
        );
    }
}
