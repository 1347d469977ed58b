//! What an operator watches and does: the Prometheus endpoint counts records in and out, checkpoints and commit
//! latency, and shows the consumer lag; logs come as JSON lines on request; SIGTERM finishes the checkpoint,
//! commits and exits 0, with every record read so far visible exactly once in every sink; a second SIGTERM exits at
//! once (130), and the next run loses nothing that was checkpointed.

use crate::common;

use std::time::{Duration, Instant};

use common::{Job, free_port, scrape, total};

#[tokio::test(flavor = "multi_thread")]
async fn metrics_json_logs_and_a_graceful_stop() {
    let mut job = Job::new("observe", 2, 2, "3s").await;
    job.produce(3000).await;
    let port = free_port();
    let mut worker = job.spawn_worker(&[
        "--metrics-listen",
        &format!("127.0.0.1:{port}"),
        "--log-format",
        "json",
    ]);
    let deadline = Instant::now() + Duration::from_secs(90);
    let body = loop {
        if let Some(body) = scrape(port)
            && total(&body, "ratchet_records_in_total") >= 3000.0
            && total(&body, "ratchet_commit_seconds_count") >= 4.0
        {
            break body;
        }
        assert!(
            Instant::now() < deadline,
            "the metrics never showed 3000 records and committed checkpoints:\n{}",
            scrape(port).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(total(&body, "ratchet_records_in_total"), 3000.0, "{body}");
    // Four sinks, each given every record.
    assert_eq!(total(&body, "ratchet_records_out_total"), 12000.0, "{body}");
    assert!(total(&body, "ratchet_checkpoints_total") >= 1.0, "{body}");
    assert!(body.contains("ratchet_checkpoint_seconds_bucket"), "{body}");
    assert!(body.contains("sink=\"lake\""), "{body}");
    assert!(body.contains("job=\"observe"), "{body}");
    assert!(
        body.contains("ratchet_pending_commit_age_seconds"),
        "{body}"
    );
    assert!(body.contains("ratchet_subtasks_running"), "{body}");

    // Records that arrive after the last checkpoint are checkpointed by the graceful stop.
    job.produce(500).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while scrape(port).is_none_or(|b| total(&b, "ratchet_records_in_total") < 3500.0) {
        assert!(
            Instant::now() < deadline,
            "the last records were never read"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    worker.stop(Duration::from_secs(60));
    let log = worker.log_text();
    let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(!lines.is_empty());
    for line in &lines {
        let parsed: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a JSON log line ({e}): {line}"));
        assert!(
            parsed["level"].is_string() && parsed["fields"].is_object(),
            "{line}"
        );
    }
    assert!(
        log.contains("subtask stopped after its last checkpoint"),
        "{log}"
    );
    job.assert_exactly_once();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_second_signal_exits_at_once_and_loses_nothing_checkpointed() {
    use test_support::Services;

    let mut job = Job::new("second-signal", 2, 2, "3s").await;
    job.produce(2000).await;
    let port = free_port();
    let mut worker = job.spawn_worker(&["--metrics-listen", &format!("127.0.0.1:{port}")]);
    job.wait_delivered(Duration::from_secs(90));
    // Hold the subtasks' claim rows, so the next checkpoint record cannot be saved: the graceful stop is stuck in
    // its last checkpoint until the second signal.
    let db = connector_common::postgres::PgConnectOptions::parse(Services::get().pg_url())
        .unwrap()
        .connect("the test's lock")
        .await
        .unwrap();
    db.batch_execute("BEGIN").await.unwrap();
    db.query(
        "SELECT 1 FROM ratchet_checkpoint_owners WHERE job = $1 FOR UPDATE",
        &[&job.name],
    )
    .await
    .unwrap();
    job.produce(2000).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while scrape(port).is_none_or(|b| total(&b, "ratchet_records_in_total") < 4000.0) {
        assert!(Instant::now() < deadline, "the new records were never read");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    worker.signal(nix::sys::signal::Signal::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !worker.log_text().contains("stopping: finishing") {
        assert!(
            Instant::now() < deadline,
            "SIGTERM not handled:\n{}",
            worker.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    worker.signal(nix::sys::signal::Signal::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = worker.exited() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "no fast exit:\n{}",
            worker.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    worker.child = None;
    assert_eq!(status.code(), Some(130), "{}", worker.log_text());
    db.batch_execute("ROLLBACK").await.unwrap();
    // The next run commits what the interrupted one decided and reads the rest again.
    let mut worker = job.spawn_worker(&["--exit-when-idle", "3s"]);
    worker.wait_exit(Duration::from_secs(120));
    job.assert_exactly_once();
}

#[tokio::test(flavor = "multi_thread")]
async fn health_and_ready_follow_the_subtasks_and_a_crash_loop_is_unhealthy() {
    use common::http_get;
    let mut job = Job::new("health", 1, 1, "3s").await;
    job.produce(10).await;
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut worker = job.spawn_worker(&["--metrics-listen", &listen]);
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if let Some((200, _)) = http_get(port, "/ready") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never ready: {:?}",
            http_get(port, "/ready")
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(http_get(port, "/health").map(|(s, _)| s), Some(200));
    assert_eq!(http_get(port, "/nowhere").map(|(s, _)| s), Some(404));
    worker.stop(Duration::from_secs(60));

    // The table's database stops answering: the subtask fails at every start and is restarted, in a loop.
    let text = std::fs::read_to_string(&job.config).unwrap();
    let jdbc = text
        .split("[[sinks]]")
        .find(|block| block.contains("type = \"jdbc\""))
        .unwrap();
    let url = jdbc
        .lines()
        .find(|l| l.starts_with("url = "))
        .unwrap()
        .to_string();
    let dead = jdbc.replace(&url, "url = \"postgres://ratchet@127.0.0.1:1/ratchet\"");
    std::fs::write(&job.config, text.replace(jdbc, &dead)).unwrap();
    let _worker = job.spawn_worker(&["--metrics-listen", &listen]);
    let deadline = Instant::now() + Duration::from_secs(60);
    let body = loop {
        if let Some((503, body)) = http_get(port, "/health") {
            break body;
        }
        assert!(
            Instant::now() < deadline,
            "never unhealthy: {:?}",
            http_get(port, "/health")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        body.contains("subtask 0 failed") && body.contains("db"),
        "{body}"
    );
    let (status, why) = http_get(port, "/ready").unwrap();
    assert_eq!(status, 503, "{why}");
}

/// SIGTERM while the process is still starting (here: its schema registry does not answer, which it retries for
/// 30 s) is a clean exit, at once, saying so: an orchestrator stopping a pod that never got going sees exit 0, not
/// a death by signal.
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_while_starting_exits_cleanly() {
    let job = Job::new("stop-starting", 1, 1, "3s").await;
    job.read_registry_avro();
    let registry = test_support::Services::get().registry();
    job.edit_config(
        &format!("url = \"{}/\"", registry.url),
        "url = \"http://127.0.0.1:1/\"",
    );
    let mut job = job;
    let mut worker = job.spawn_worker(&[]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !worker.log_text().contains("/subjects/") {
        assert!(worker.exited().is_none(), "{}", worker.log_text());
        assert!(
            Instant::now() < deadline,
            "never waited for the registry:\n{}",
            worker.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    worker.stop(Duration::from_secs(5));
    assert!(
        worker.log_text().contains("stopped before the job started"),
        "{}",
        worker.log_text()
    );
}

/// The decided positions reach the consumer group `ratchet.<job>` (informational), so the usual tools show the
/// job's lag: after the job caught up, the group (read with the AdminClient requests `kafka-consumer-groups
/// --describe` makes) holds every partition's end offset, and has no members (nothing joins it).
#[tokio::test(flavor = "multi_thread")]
async fn decided_positions_show_as_consumer_group_lag() {
    let mut job = Job::new("lag", 2, 2, "3s").await;
    job.produce(3000).await;
    let mut worker = job.spawn_worker(&["--exit-when-idle", "2s"]);
    worker.wait_exit(Duration::from_secs(120));
    job.assert_exactly_once();
    let services = test_support::Services::get();
    let group = format!("ratchet.{}", job.name);
    let deadline = Instant::now() + Duration::from_secs(30);
    let seen = loop {
        let seen = services.verify(
            "kafka_group_offsets.py",
            &[services.kafka_bootstrap(), &group],
        );
        let committed: i64 = seen["offsets"]
            .as_object()
            .unwrap()
            .values()
            .map(|o| o.as_i64().unwrap())
            .sum();
        if committed == 3000 {
            break seen;
        }
        assert!(
            Instant::now() < deadline,
            "group {group} shows {seen}, not 3000 records read"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(seen["offsets"].as_object().unwrap().len(), 2, "{seen}");
    assert_eq!(seen["members"], 0, "{seen}");
}

/// On a transactional input topic, each transaction ends in a commit marker that read_committed readers skip: the
/// positions (and the lag group) still reach each partition's end offset, so the usual tools show a lag of zero,
/// not one per partition for ever.
#[tokio::test(flavor = "multi_thread")]
async fn lag_reaches_zero_on_a_transactional_input_topic() {
    let mut job = Job::new("txlag", 2, 2, "3s").await;
    job.produce_transactionally(300, 50);
    job.spawn_worker(&["--exit-when-idle", "2s"])
        .wait_exit(Duration::from_secs(120));
    job.assert_exactly_once();
    let services = test_support::Services::get();
    let ends = services.verify(
        "kafka_end_offsets.py",
        &[services.kafka_bootstrap(), &job.topic],
    );
    let group = format!("ratchet.{}", job.name);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let seen = services.verify(
            "kafka_group_offsets.py",
            &[services.kafka_bootstrap(), &group],
        );
        let offsets = seen["offsets"].as_object().unwrap();
        let at_end = ends.as_object().unwrap().iter().all(|(partition, end)| {
            offsets.get(&format!("{}/{partition}", job.topic)) == Some(end)
        });
        if at_end {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "group {group} shows {seen}, not the end offsets {ends}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
