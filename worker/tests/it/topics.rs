//! Many topics per job: `topic_pattern` selects the topics there at start and one created while the job runs
//! (found by the metadata refresh); each record lands once in all four sinks, across a SIGKILL, read by the
//! independent readers; the `topic` metadata column names each row's topic.

use crate::common;

use std::time::Duration;

use common::{Job, create_topic};
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
