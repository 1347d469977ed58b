//! Avro input: values in Confluent's wire format (`0x00`, schema id, body), written by arrow-avro's own writer and
//! decoded with the schema declared in the job file, or written by confluent-kafka's AvroSerializer in two schema
//! versions and looked up in the schema registry; every sink's independent reader sees every id once.

use crate::common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::{Int64Array, RecordBatch};
use arrow_avro::schema::{FingerprintStrategy, SCHEMA_METADATA_KEY};
use arrow_avro::writer::WriterBuilder;
use arrow_avro::writer::format::AvroSoeFormat;
use arrow_schema::{DataType, Field, Schema};
use common::Job;
use serde_json::json;

const SCHEMA: &str = r#"{"type":"record","name":"Order","fields":[{"name":"id","type":"long"}]}"#;
const SCHEMA_ID: u32 = 42;

/// One Confluent-framed Avro record `{"id": id}`.
fn encode(id: i64) -> Vec<u8> {
    let metadata = HashMap::from([(SCHEMA_METADATA_KEY.to_string(), SCHEMA.to_string())]);
    let schema =
        Schema::new_with_metadata(vec![Field::new("id", DataType::Int64, false)], metadata);
    let batch = RecordBatch::try_new(
        Arc::new(schema.clone()),
        vec![Arc::new(Int64Array::from(vec![id]))],
    )
    .unwrap();
    let mut writer = WriterBuilder::new(schema)
        .with_fingerprint_strategy(FingerprintStrategy::Id(SCHEMA_ID))
        .build::<_, AvroSoeFormat>(Vec::new())
        .unwrap();
    writer.write(&batch).unwrap();
    writer.finish().unwrap();
    writer.into_inner()
}

#[tokio::test(flavor = "multi_thread")]
async fn confluent_framed_avro_reaches_every_sink_once() {
    let decoding = format!(
        "{{ kind = \"avro\", framing = \"confluent\", schema_id = {SCHEMA_ID}, schema = '{SCHEMA}' }}"
    );
    let mut job = Job::with_decoding("avro", 2, 2, "3s", &decoding).await;
    assert_eq!(
        encode(7)[0],
        0,
        "Confluent framing starts with the magic byte"
    );
    job.produce_encoded(3000, encode).await;
    let mut worker = job.spawn_worker(&["--exit-when-idle", "3s"]);
    worker.wait_exit(Duration::from_secs(120));
    job.assert_exactly_once();
}

#[tokio::test(flavor = "multi_thread")]
async fn registry_avro_in_two_versions_reaches_every_sink_once_as_the_latest() {
    let services = test_support::Services::get();
    let registry = services.registry();
    let mut job = Job::new("avro_registry", 2, 2, "3s").await;
    job.read_registry_avro();
    job.produce_avro(&common::order_schema(&[]), 150, |_| json!({}));
    job.produce_avro(
        &common::order_schema(&[("qty", "long")]),
        150,
        |id| json!({ "qty": id }),
    );

    let check = job.ratchet("check-config");
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
    let mut worker = job.spawn_worker(&["--exit-when-idle", "3s"]);
    worker.wait_exit(Duration::from_secs(120));
    job.assert_exactly_once();
    // Read as the latest version: the first version's records have no qty (its default), the second's have theirs.
    let summary = services.psql(&format!(
        "SELECT count(*) FILTER (WHERE qty IS NULL AND id < 150), count(*) FILTER (WHERE qty = id AND id >= 150), \
         count(*) FILTER (WHERE note = 'n' || id) FROM \"{}\"",
        job.table
    ));
    assert_eq!(summary.trim(), "150|150|300");

    // Wrong credentials: check-config names the registry's refusal.
    job.edit_config(
        &format!("password = \"{}\"", registry.password),
        "password = \"not-the-registry-password\"",
    );
    let check = job.ratchet("check-config");
    let stderr = format!(
        "{}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    assert!(
        !check.status.success() && stderr.contains("401"),
        "{stderr}"
    );
    assert!(!stderr.contains("not-the-registry-password"), "{stderr}");
}
