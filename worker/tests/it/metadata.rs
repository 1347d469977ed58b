//! Record metadata as columns through `ratchet run`: a JSON job whose `[source.metadata]` adds the key, partition,
//! offset and timestamp of each record; every sink gets every record once, and the PostgreSQL table (read with
//! psql) holds each record's own metadata.

use crate::common;

use std::time::Duration;

use common::Job;
use test_support::Services;

#[tokio::test(flavor = "multi_thread")]
async fn metadata_columns_reach_the_sinks_with_each_records_own_values() {
    let mut job = Job::with_sections("meta", 2, 2, "3s", |_| {
        "\n[source.metadata]\nkey = \"kafka_key\"\npartition = \"kafka_partition\"\n\
         offset = \"kafka_offset\"\ntimestamp = \"kafka_timestamp\"\n"
            .to_string()
    })
    .await;
    job.produce(200).await;
    let check = job.ratchet("check-config");
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
    let mut worker = job.spawn_worker(&["--exit-when-idle", "3s"]);
    worker.wait_exit(Duration::from_secs(120));
    job.assert_exactly_once();

    // Every row carries its own key (the producer keys record n with "n"), a partition of the topic, an offset
    // unique within it, and a timestamp from the last hour.
    let services = Services::get();
    let summary = services.psql(&format!(
        "SELECT count(*), count(DISTINCT (kafka_partition, kafka_offset)) FROM \"{table}\"
         WHERE kafka_key = id::text AND kafka_partition IN (0, 1) AND kafka_offset >= 0
           AND kafka_timestamp > now() - interval '1 hour'",
        table = job.table
    ));
    assert_eq!(summary.trim(), "200|200", "rows with their own metadata");
}
