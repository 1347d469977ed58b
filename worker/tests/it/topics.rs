//! Many topics per job: `topic_pattern` selects the topics there at start and one created while the job runs
//! (found by the metadata refresh); each record lands once in all four sinks, across a SIGKILL, read by the
//! independent readers; the `topic` metadata column names each row's topic. Routed sinks (`${topic}` in a table,
//! path or topic) put each topic's records in that topic's own table, directory and topic. A job never reads what
//! it writes: a pattern matching its dead-letter or Kafka sink topic is refused, and such a topic created later is
//! skipped.

use crate::common;

use std::collections::BTreeMap;
use std::ops::Range;
use std::time::{Duration, Instant};

use common::{Job, create_topic, sorted_ids};
use test_support::Services;

#[tokio::test(flavor = "multi_thread")]
async fn a_pattern_reads_every_matching_topic_and_one_created_while_running() {
    let mut job = Job::with_sections("topics", 2, 3, "3s", |_| {
        "\n[source.metadata]\ntopic = \"source_topic\"\n".to_string()
    })
    .await;
    let name = job.name.clone();
    let more = format!("{name}-more");
    let late = format!("{name}-late");
    create_topic(&more, 3).await;
    // The copy topic `<name>-copy` does not match: the job must not read what it writes.
    job.edit_config(
        &format!("topic = \"{}\"", job.topic),
        &format!("topic_pattern = \"{name}-(in|more|late)\"\nmetadata_refresh = \"1s\""),
    );
    let check = job.ratchet("check-config");
    let said = String::from_utf8_lossy(&check.stdout).to_string();
    assert!(
        check.status.success() && said.contains("(2 now:") && said.contains(&more),
        "{said}\n{}",
        String::from_utf8_lossy(&check.stderr)
    );

    let topic = job.topic.clone();
    job.produce(1000).await;
    job.produce_into(&more, 1000).await;
    let mut worker = job.spawn_worker(&[]);
    job.wait_delivered(Duration::from_secs(120));

    create_topic(&late, 2).await;
    job.produce_into(&late, 1000).await;
    worker.wait_logged("a new topic is selected", 1, Duration::from_secs(60));
    job.produce_into(&topic, 500).await;
    worker.kill9();
    let mut worker = job.spawn_worker(&[]);
    job.produce_into(&late, 500).await;
    job.wait_delivered(Duration::from_secs(120));
    worker.stop(Duration::from_secs(60));
    job.assert_exactly_once();

    // Each row names its topic: 1,500 from the first, 1,000 from the second, 1,500 from the one created later.
    let services = Services::get();
    let counts = services.psql(&format!(
        "select source_topic, count(*) from {name} group by source_topic order by 1"
    ));
    assert_eq!(
        counts.trim(),
        format!("{name}-in|1500\n{late}|1500\n{more}|1000"),
        "{counts}"
    );
}

/// One `topic` and `topics` deal partitions to subtasks differently: a job that switches is refused by `run` and
/// `check-config` (the store records how it started), and runs on from where it stopped once switched back.
#[tokio::test(flavor = "multi_thread")]
async fn a_job_cannot_switch_between_one_topic_and_several() {
    let mut job = Job::new("layout", 3, 3, "3s").await;
    job.produce(300).await;
    job.spawn_worker(&["--exit-when-idle", "2s"])
        .wait_exit(Duration::from_secs(120));
    let one = format!("topic = \"{}\"", job.topic);
    let several = format!("topics = [\"{}\"]", job.topic);
    job.edit_config(&one, &several);
    for command in ["check-config", "run"] {
        let out = job.ratchet(command);
        let said = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && said.contains("deal partitions to subtasks differently"),
            "{command}: {said}"
        );
    }
    job.edit_config(&several, &one);
    job.produce(300).await;
    job.spawn_worker(&["--exit-when-idle", "2s"])
        .wait_exit(Duration::from_secs(120));
    job.assert_exactly_once();
}

/// Every sink routed by topic: a file directory, a Kafka topic, a PostgreSQL table and an Iceberg table per source
/// topic, over three topics (one created while running, which restarts the subtask that reads it with a new
/// instance), across a SIGKILL. Each topic's records are in its own place, once, per the independent readers, and
/// nothing is left open or prepared.
#[tokio::test(flavor = "multi_thread")]
async fn routed_sinks_give_each_topic_its_own_table_directory_and_topic() {
    let mut job = Job::new("routed", 2, 3, "3s").await;
    let name = job.name.clone();
    let (first, more, late) = (
        job.topic.clone(),
        format!("{name}-more"),
        format!("{name}-late"),
    );
    let copy = |topic: &str| format!("{name}-copy-{topic}");
    create_topic(&more, 3).await;
    for topic in [&first, &more, &late] {
        create_topic(&copy(topic), 2).await;
    }
    route_every_sink(&job, &format!("{name}-(in|more|late)"));
    let check = job.ratchet("check-config");
    let said = String::from_utf8_lossy(&check.stdout).to_string();
    assert!(
        check.status.success()
            && said.contains(&format!(
                "sink db-{more} (jdbc, exactly-once) for topic {more}"
            )),
        "{said}\n{}",
        String::from_utf8_lossy(&check.stderr)
    );

    let mut sent: BTreeMap<String, Vec<Range<i64>>> = BTreeMap::new();
    let mut produce = async |job: &mut Job, topic: &str, count: u64| {
        let from = job.produced as i64;
        job.produce_into(topic, count).await;
        sent.entry(topic.to_string())
            .or_default()
            .push(from..job.produced as i64);
    };
    produce(&mut job, &first, 1000).await;
    produce(&mut job, &more, 1000).await;
    let mut worker = job.spawn_worker(&[]);
    wait_copied(&copy(&more), 1000);

    create_topic(&late, 2).await;
    produce(&mut job, &late, 1000).await;
    worker.wait_logged(
        "starting the subtask again with one",
        1,
        Duration::from_secs(60),
    );
    produce(&mut job, &first, 500).await;
    worker.kill9();
    let mut worker = job.spawn_worker(&[]);
    produce(&mut job, &late, 500).await;
    wait_copied(&copy(&first), 1500);
    wait_copied(&copy(&late), 1500);
    worker.stop(Duration::from_secs(60));
    // A topic no longer selected keeps its instances while the checkpoints hold its positions: built from the
    // restored record, they start (and recover) as before.
    job.edit_config("-(in|more|late)", "-(in|late)");
    produce(&mut job, &first, 100).await;
    job.spawn_worker(&["--exit-when-idle", "2s"])
        .wait_exit(Duration::from_secs(120));

    assert_each_topic_once(&job, &sent);
}

/// A pattern that matches the job's own dead-letter topic is refused by `check-config` and by `run` before it
/// writes anything; a topic created later that the pattern matches and a routed Kafka sink writes is skipped with a
/// warning naming it, so its records are copied once and never read back.
#[tokio::test(flavor = "multi_thread")]
async fn a_job_never_reads_what_it_writes() {
    let mut job = Job::with_sections("selfread", 2, 2, "3s", |name| {
        format!("\n[dead_letter]\ntopic = \"{name}-dead\"\n")
    })
    .await;
    let name = job.name.clone();
    create_topic(&format!("{name}-dead"), 1).await;
    job.edit_config(
        &format!("topic = \"{}\"", job.topic),
        &format!("topic_pattern = \"{name}-.*\"\nmetadata_refresh = \"1s\""),
    );
    for command in ["check-config", "run"] {
        let out = job.ratchet(command);
        let said = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success()
                && said.contains("a job never reads what it writes")
                && said.contains(&format!("matches \"{name}-")),
            "{command}: {said}"
        );
    }

    // Narrowed past the dead-letter topic, with the copy routed to `<topic>-copy`: nothing matches at start.
    let late = format!("{name}-x1");
    let late_copy = format!("{late}-copy");
    job.edit_config(
        &format!("topic_pattern = \"{name}-.*\""),
        &format!("topic_pattern = \"{name}-x.*\""),
    );
    job.edit_config(
        &format!("topic = \"{}\"", job.copy_topic),
        "topic = \"${topic}-copy\"",
    );
    job.edit_config(
        &format!("transactional_id_prefix = \"{}\"", job.copy_topic),
        &format!("transactional_id_prefix = \"{name}-${{topic_safe}}\""),
    );
    let mut worker = job.spawn_worker(&[]);
    // Past its start (where a matching written topic is refused, as above) before the topics appear: under load
    // a start after the creation met the copy topic there and stopped.
    worker.wait_logged("subtask claimed and recovered", 1, Duration::from_secs(60));
    create_topic(&late_copy, 2).await;
    create_topic(&late, 2).await;
    job.produce_into(&late, 500).await;
    worker.wait_logged(&format!("topic={late_copy}"), 1, Duration::from_secs(60));
    wait_copied(&late_copy, 500);
    job.produce_into(&late, 100).await;
    wait_copied(&late_copy, 600);
    // Time for a loop to show, were there one (three metadata refreshes).
    std::thread::sleep(Duration::from_secs(3));
    worker.stop(Duration::from_secs(60));
    let log = worker.log_text();
    assert!(
        log.contains("this job writes it") && log.contains(&late_copy),
        "{log}"
    );
    let services = Services::get();
    let (copied, _) = services.kafka_ids(services.kafka_bootstrap(), &late_copy);
    assert_eq!(
        copied,
        (0..600).collect::<Vec<i64>>(),
        "the copy holds each record once"
    );
}

/// Two topics whose `${topic_safe}` names collide (`x-y`, and `x_y` created later), held by different subtasks:
/// the job stops naming both instead of writing both into one table (the check is job-wide, not per subtask).
#[tokio::test(flavor = "multi_thread")]
async fn routed_names_that_collide_across_subtasks_are_refused() {
    let mut job = Job::new("collide", 1, 3, "3s").await;
    let name = job.name.clone();
    // Topics of one partition each, chosen to land on different subtasks of three (FNV-1a keeps the parity of
    // names that differ in `-` and `_`, so two subtasks would always hold both together).
    let (dashed, underscored) = (0..1000)
        .map(|tag| (format!("{name}-t{tag}-x"), format!("{name}-t{tag}_x")))
        .find(|(a, b)| kafka_source::topic_hash(a) % 3 != kafka_source::topic_hash(b) % 3)
        .expect("names on different subtasks");
    create_topic(&dashed, 1).await;
    job.edit_config(
        &format!("topic = \"{}\"", job.topic),
        &format!("topic_pattern = \"{name}-t.*\"\nmetadata_refresh = \"1s\""),
    );
    job.edit_config(
        &format!("table = \"{name}\"\nscope = \"{name}\""),
        "table = \"c_${topic_safe}\"",
    );
    job.produce_into(&dashed, 10).await;
    let mut worker = job.spawn_worker(&[]);
    let services = Services::get();
    let table = format!("c_{}", dashed.replace('-', "_"));
    let deadline = Instant::now() + Duration::from_secs(90);
    let rows = || {
        let exists = services.psql(&format!("select to_regclass('{table}') is not null"));
        (exists.trim() == "t").then(|| services.psql(&format!("select count(*) from {table}")))
    };
    while rows().is_none_or(|n| n.trim() != "10") {
        assert!(
            Instant::now() < deadline,
            "{table} never held the first topic's rows"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    create_topic(&underscored, 1).await;
    job.produce_into(&underscored, 10).await;
    let log = worker.wait_failed(Duration::from_secs(120));
    assert!(
        log.contains("route sink db to the same place")
            && log.contains(&dashed)
            && log.contains(&underscored),
        "{log}"
    );
    assert_eq!(
        services
            .psql(&format!("select count(*) from {table}"))
            .trim(),
        "10",
        "only the first topic's rows are in {table}"
    );
}

/// A topic dropped from the selection keeps its positions (and its routed instances) until `ratchet forget-topic`
/// retires it: refused while the topic is selected or the job runs; afterwards its routed table can be dropped
/// and the job still starts, and the topic, selected again, is read as new: from its beginning, into a table of
/// its own, once.
#[tokio::test(flavor = "multi_thread")]
async fn a_retired_topic_is_forgotten_and_read_as_new_when_selected_again() {
    let mut job = Job::new("forget", 1, 2, "3s").await;
    let name = job.name.clone();
    let (kept, retired) = (job.topic.clone(), format!("{name}-old"));
    create_topic(&retired, 2).await;
    job.edit_config(
        &format!("topic = \"{kept}\""),
        &format!("topic_pattern = \"{name}-(in|old)\""),
    );
    job.edit_config(
        &format!("table = \"{name}\"\nscope = \"{name}\""),
        "table = \"f_${topic_safe}\"",
    );
    job.produce_into(&kept, 100).await;
    job.produce_into(&retired, 100).await;
    job.spawn_worker(&["--exit-when-idle", "2s"])
        .wait_exit(Duration::from_secs(120));
    let services = Services::get();
    let table = |topic: &str| format!("f_{}", topic.replace('-', "_"));
    let ids = |topic: &str| {
        sorted_ids(
            &services.verify(
                "sql_table.py",
                &["pg", services.pg_url(), &table(topic), "id"],
            )["ids"],
        )
    };
    assert_eq!(ids(&retired), (100..200).collect::<Vec<i64>>());

    let forget = ["forget-topic", "--topic", retired.as_str()];
    let out = job.ratchet_with(&forget);
    assert!(
        !out.status.success()
            && String::from_utf8_lossy(&out.stderr).contains("still selects topic"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    job.edit_config(&format!("{name}-(in|old)"), &format!("{name}-(in)"));
    let mut running = job.spawn_worker(&[]);
    running.wait_logged("subtask claimed and recovered", 2, Duration::from_secs(60));
    let out = job.ratchet_with(&forget);
    assert!(
        !out.status.success()
            && String::from_utf8_lossy(&out.stderr).contains("is running in 1 process(es)"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    running.stop(Duration::from_secs(60));
    // Killed once subtask 0 is saved without the topic: run again, it finishes with subtask 1.
    let killed = std::process::Command::new(env!("CARGO_BIN_EXE_ratchet"))
        .args(forget)
        .arg("--config")
        .arg(&job.config)
        .env("RATCHET_FORGET_KILL_AT", "after-subtask-0")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&killed.stdout).to_string();
    assert!(
        std::os::unix::process::ExitStatusExt::signal(&killed.status) == Some(9)
            && said.contains("subtask 0: 1 position(s)")
            && !said.contains("subtask 1"),
        "{said}\n{}",
        String::from_utf8_lossy(&killed.stderr)
    );
    let out = job.ratchet_with(&forget);
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success()
            && !said.contains("subtask 0:")
            && said.contains("subtask 1: 1 position(s)")
            && said.contains(&format!("forgot topic \"{retired}\"")),
        "{said}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Its table dropped: the job starts without the topic's instance.
    services.psql(&format!("drop table {}", table(&retired)));
    job.produce_into(&kept, 50).await;
    job.spawn_worker(&["--exit-when-idle", "2s"])
        .wait_exit(Duration::from_secs(120));
    assert_eq!(ids(&kept), (0..100).chain(200..250).collect::<Vec<i64>>());
    // Selected again: read as new, from its beginning (its old records and new ones), into a new table.
    job.edit_config(&format!("{name}-(in)"), &format!("{name}-(in|old)"));
    job.produce_into(&retired, 50).await;
    job.spawn_worker(&["--exit-when-idle", "2s"])
        .wait_exit(Duration::from_secs(120));
    assert_eq!(
        ids(&retired),
        (100..200).chain(250..300).collect::<Vec<i64>>()
    );
}

/// Makes every sink of `job` routed by topic, and its source the topics `pattern` matches: files under
/// `out/${topic}`, Kafka into `<job>-copy-${topic}`, PostgreSQL table `r_${topic_safe}`, Iceberg table
/// `<job>.${topic_safe}`.
pub(crate) fn route_every_sink(job: &Job, pattern: &str) {
    let name = &job.name;
    let out = job.dir.path().join("out").display().to_string();
    for (from, to) in [
        (
            format!("topic = \"{}\"", job.topic),
            format!("topic_pattern = \"{pattern}\"\nmetadata_refresh = \"1s\""),
        ),
        (
            format!("path = \"{out}\""),
            format!("path = \"{out}/${{topic}}\""),
        ),
        (
            format!(
                "topic = \"{}\"\ntransactional_id_prefix = \"{}\"",
                job.copy_topic, job.copy_topic
            ),
            format!("topic = \"{name}-copy-${{topic}}\""),
        ),
        (
            format!("table = \"{name}\"\nscope = \"{name}\""),
            "table = \"r_${topic_safe}\"".to_string(),
        ),
        (
            format!("table = \"{name}.orders\""),
            format!("table = \"{name}.${{topic_safe}}\""),
        ),
    ] {
        job.edit_config(&from, &to);
    }
}

/// Checks, with the independent readers, that each topic's records (the ids in `sent`) are each once in that
/// topic's own directory, Kafka topic, PostgreSQL table and Iceberg table ([`route_every_sink`]), with no stray
/// file, no unreferenced Iceberg file and no prepared transaction left.
pub(crate) fn assert_each_topic_once(job: &Job, sent: &BTreeMap<String, Vec<Range<i64>>>) {
    let name = &job.name;
    let out = job.dir.path().join("out").display().to_string();
    let copy = |topic: &str| format!("{name}-copy-{topic}");
    let services = Services::get();
    let warehouse = format!("file://{}", job.dir.path().join("warehouse").display());
    let catalog = services
        .pg_url()
        .replacen("postgres://", "postgresql+psycopg://", 1);
    for (topic, ranges) in sent {
        let expected: Vec<i64> = ranges.iter().flat_map(|r| r.clone()).collect();
        let safe = topic.replace('-', "_");
        let files = services.verify(
            "visible_ids.py",
            &["local", &format!("{out}/{topic}"), "id"],
        );
        assert_eq!(
            files["strays"],
            serde_json::json!([]),
            "{topic}: the file sink left strays"
        );
        let (kafka, _) = services.kafka_ids(services.kafka_bootstrap(), &copy(topic));
        let table = services.verify(
            "sql_table.py",
            &["pg", services.pg_url(), &format!("r_{safe}"), "id"],
        );
        let lake = services.verify(
            "iceberg_table.py",
            &[
                "ratchet",
                &catalog,
                &warehouse,
                &format!("{name}.{safe}"),
                "id",
            ],
        );
        assert_eq!(
            lake["unreferenced"],
            serde_json::json!([]),
            "{topic}: Iceberg files left behind"
        );
        for (sink, ids) in [
            ("files", sorted_ids(&files["ids"])),
            ("kafka", kafka),
            ("table", sorted_ids(&table["ids"])),
            ("iceberg", sorted_ids(&lake["ids"])),
            ("iceberg (DuckDB)", sorted_ids(&lake["duckdb_ids"])),
        ] {
            assert!(
                ids == expected,
                "{topic} in {sink}: {} rows for {} records",
                ids.len(),
                expected.len()
            );
        }
    }
    let prepared = services.psql(&format!(
        "select count(*) from pg_prepared_xacts where gid like 'ratchet.{name}~%'"
    ));
    assert_eq!(prepared.trim(), "0", "prepared transactions left");
}

/// Waits (polling the read_committed verifier) until `topic` holds `records` records.
pub(crate) fn wait_copied(topic: &str, records: usize) {
    let services = Services::get();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (ids, _) = services.kafka_ids(services.kafka_bootstrap(), topic);
        if ids.len() >= records {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "only {} of {records} records reached {topic}",
            ids.len()
        );
        std::thread::sleep(Duration::from_secs(1));
    }
}
