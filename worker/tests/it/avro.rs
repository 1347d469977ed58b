//! Avro input: values in Confluent's wire format (`0x00`, schema id, body), written by arrow-avro's own writer,
//! decoded with the schema declared in the job file; every sink's independent reader sees every id once.

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
