//! `[job] kafka_to_kafka = true`: the fast path (source offsets inside each Kafka transaction) through
//! `ratchet run`, killed with SIGKILL while copying, restarted, and stopped with SIGTERM: the read_committed
//! verifier sees every record once in the target topic, and no open transaction.

use crate::common;

use std::time::{Duration, Instant};

use common::Job;
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

    let mut worker = job.spawn_worker(&[]);
    job.produce(2000).await;
    job.wait_delivered(Duration::from_secs(90));
    worker.stop(Duration::from_secs(60));

    let (ids, partitions) = services.kafka_ids(services.kafka_bootstrap(), &job.copy_topic);
    assert_eq!(ids, (0..12_000).collect::<Vec<i64>>());
    for (p, offsets) in partitions.as_object().unwrap() {
        assert_eq!(
            offsets["lso"], offsets["high_watermark"],
            "open transaction on {p}"
        );
    }
}
