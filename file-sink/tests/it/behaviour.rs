//! File sink behaviour against real storage, read back with the Python verifier: formats, partitions, rolling,
//! S3 multipart uploads across a crash, and clear errors for bad input and bad S3 settings.

use crate::common;

use std::sync::Arc;

use arrow_array::{Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use common::{Place, config};
use connector_api::{CheckpointId, ErrorKind, Resolution, SinkId, SubtaskId, TwoPhaseCommit};
use file_sink::{
    FileSink, FileSinkConfig, FormatConfig, PartitionConfig, RollingPolicy, StorageConfig,
};
use ratchet_conformance::conformance_batch_with;

fn rows(ids: std::ops::Range<i64>, payload_len: usize) -> RecordBatch {
    conformance_batch_with(ids, |i| format!("{i:0>payload_len$}"))
}

fn sink_id() -> SinkId {
    SinkId::new("files").unwrap()
}

fn sorted(mut ids: Vec<i64>) -> Vec<i64> {
    ids.sort_unstable();
    ids
}

/// Writes `batches` as checkpoint 2 of a fresh sink and commits it.
async fn write_and_commit(config: FileSinkConfig, batches: &[RecordBatch]) -> FileSink {
    let mut sink = FileSink::new(config).await.unwrap();
    sink.recover(None).await.unwrap();
    sink.begin(CheckpointId(2)).await.unwrap();
    for batch in batches {
        sink.write(batch).await.unwrap();
    }
    let committable = sink.pre_commit(CheckpointId(2)).await.unwrap();
    sink.commit(vec![committable]).await.unwrap();
    sink
}

#[tokio::test]
async fn json_lines_and_csv_are_readable_by_pyarrow() {
    let (place, _dir) = Place::local();
    for (sub, format) in [
        ("json", FormatConfig::JsonLines),
        ("csv", FormatConfig::Csv),
    ] {
        let mut config = config(&place, sub, &sink_id());
        config.format = format;
        write_and_commit(config, &[rows(0..50, 8), rows(50..60, 8)]).await;
        let (ids, files, strays) = place.read(sub, "id");
        assert_eq!(sorted(ids), (0..60).collect::<Vec<_>>(), "{sub}");
        assert_eq!(files.len(), 1, "{sub}: {files:?}");
        assert!(strays.is_empty(), "{sub}: {strays:?}");
    }
}

#[tokio::test]
async fn partitions_by_field_and_rolls_by_record_count() {
    let (place, _dir) = Place::local();
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("country", DataType::Utf8, false),
    ]));
    let mut config = FileSinkConfig::new(
        sink_id(),
        SubtaskId(0),
        schema.clone(),
        place.storage("parts"),
    );
    config.partition = PartitionConfig {
        fields: vec!["country".into()],
        time: None,
    };
    config.rolling = RollingPolicy {
        max_records: 10,
        ..RollingPolicy::default()
    };
    let countries: Vec<&str> = (0..45)
        .map(|i| if i % 3 == 0 { "de" } else { "fr" })
        .collect();
    let batch = RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int64Array::from_iter_values(0..45)),
            Arc::new(StringArray::from(countries)),
        ],
    )
    .unwrap();
    // Written in slices of 5 rows so that files roll mid-checkpoint.
    let slices: Vec<RecordBatch> = (0..9).map(|i| batch.slice(i * 5, 5)).collect();
    write_and_commit(config, &slices).await;
    let (ids, files, _) = place.read("parts", "id");
    assert_eq!(sorted(ids), (0..45).collect::<Vec<_>>());
    let de = files
        .iter()
        .filter(|f| f.starts_with("country=de/"))
        .count();
    let fr = files
        .iter()
        .filter(|f| f.starts_with("country=fr/"))
        .count();
    // 15 rows of "de" in files of at most 10 → 2 files; 30 of "fr" → 3 files.
    assert_eq!((de, fr), (2, 3), "{files:?}");
}

#[tokio::test]
async fn rolls_by_size() {
    let (place, _dir) = Place::local();
    let mut config = config(&place, "sized", &sink_id());
    config.format = FormatConfig::JsonLines;
    config.rolling = RollingPolicy {
        max_bytes: 4096,
        ..RollingPolicy::default()
    };
    // 20 batches of 10 rows of ~130 bytes: a file passes 4 KiB every few batches.
    let batches: Vec<RecordBatch> = (0..20).map(|i| rows(i * 10..(i + 1) * 10, 100)).collect();
    write_and_commit(config, &batches).await;
    let (ids, files, _) = place.read("sized", "id");
    assert_eq!(sorted(ids), (0..200).collect::<Vec<_>>());
    assert!(
        files.len() >= 5,
        "expected several size-rolled files: {files:?}"
    );
}

#[tokio::test]
async fn a_batch_with_the_wrong_schema_is_refused_naming_the_field() {
    let (place, _dir) = Place::local();
    let mut sink = FileSink::new(config(&place, "bad", &sink_id()))
        .await
        .unwrap();
    sink.recover(None).await.unwrap();
    sink.begin(CheckpointId(2)).await.unwrap();
    let wrong = RecordBatch::try_new(
        Arc::new(Schema::new(vec![Field::new("id", DataType::Utf8, false)])),
        vec![Arc::new(StringArray::from(vec!["x"]))],
    )
    .unwrap();
    let err = sink.write(&wrong).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BadRecord);
    assert!(
        err.to_string().contains("field \"id\" has type Utf8"),
        "{err}"
    );
}

#[tokio::test]
async fn s3_multipart_file_survives_a_crash_between_pre_commit_and_commit() {
    let place = Place::s3("multipart");
    let mut config = config(&place, "big", &sink_id());
    config.format = FormatConfig::JsonLines;
    // ~13 MB of JSON: two full 5 MiB parts and a last one.
    let batches: Vec<RecordBatch> = (0..13)
        .map(|i| rows(i * 1000..(i + 1) * 1000, 1000))
        .collect();

    let mut crashed = FileSink::new(config.clone()).await.unwrap();
    crashed.recover(None).await.unwrap();
    crashed.begin(CheckpointId(2)).await.unwrap();
    for batch in &batches {
        crashed.write(batch).await.unwrap();
    }
    let durable = crashed.pre_commit(CheckpointId(2)).await.unwrap();
    match &durable.files[..] {
        [file_sink::StagedFile::Multipart { parts, .. }] => {
            assert_eq!(parts.len(), 3, "{durable:?}")
        }
        other => panic!("expected one multipart file, got {other:?}"),
    }
    // Checkpoint 3 was being written when the process died: an open upload with two parts.
    crashed.begin(CheckpointId(3)).await.unwrap();
    for batch in &batches[..11] {
        crashed.write(batch).await.unwrap();
    }
    drop(crashed);
    let (ids, _, strays) = place.read("big", "id");
    assert!(ids.is_empty(), "nothing may be visible before commit");
    assert_eq!(strays.len(), 2, "two open multipart uploads: {strays:?}");

    // What `ratchet inspect` shows before recovery: the decided checkpoint's upload to complete, the crashed one's
    // (and its local spill file) to abort.
    let mut inspector = FileSink::new(config.clone()).await.unwrap();
    let view = inspector
        .inspect(Some((CheckpointId(2), vec![durable.clone()])))
        .await
        .unwrap();
    let uploads: Vec<_> = view
        .found
        .iter()
        .filter(|t| t.state == "multipart upload")
        .collect();
    assert_eq!(uploads.len(), 2, "{view:?}");
    for upload in &uploads {
        let expected = match upload.checkpoint {
            Some(CheckpointId(2)) => Resolution::Commit,
            Some(CheckpointId(3)) => Resolution::Abort,
            other => panic!("an upload of checkpoint {other:?}: {view:?}"),
        };
        assert_eq!(upload.resolution, expected, "{upload:?}");
        assert!(
            upload.age.is_some(),
            "S3 says when an upload began: {upload:?}"
        );
    }
    for other in view.found.iter().filter(|t| t.state != "multipart upload") {
        assert_eq!(other.state, "spill file", "{other:?}");
        assert_eq!(other.resolution, Resolution::Abort, "{other:?}");
    }

    let mut restarted = FileSink::new(config).await.unwrap();
    restarted
        .recover(Some((CheckpointId(2), vec![durable.clone()])))
        .await
        .unwrap();
    restarted
        .recover(Some((CheckpointId(2), vec![durable])))
        .await
        .unwrap(); // twice: a no-op
    let (ids, files, strays) = place.read("big", "id");
    assert_eq!(sorted(ids), (0..13_000).collect::<Vec<_>>());
    assert_eq!(files.len(), 1);
    assert!(
        strays.is_empty(),
        "recovery must abort the crashed upload: {strays:?}"
    );
}

#[tokio::test]
async fn a_missing_bucket_stops_the_sink_naming_the_bucket() {
    let place = Place::s3("missing-bucket");
    let mut config = config(&place, "x", &sink_id());
    if let StorageConfig::S3(s3) = &mut config.storage {
        s3.bucket = "no-such-bucket-ratchet".into();
    }
    let err = FileSink::new(config)
        .await
        .err()
        .expect("a missing bucket is refused");
    assert_eq!(err.kind(), ErrorKind::Fatal, "{err}");
    let message = connector_api::Report(&err).to_string();
    assert!(message.contains("s3://no-such-bucket-ratchet"), "{message}");
}

#[tokio::test]
async fn wrong_credentials_stop_the_sink_with_access_denied() {
    let place = Place::s3("bad-credentials");
    let mut config = config(&place, "x", &sink_id());
    if let StorageConfig::S3(s3) = &mut config.storage {
        s3.secret_access_key = Some(String::from("wrong-secret").into());
    }
    let err = FileSink::new(config)
        .await
        .err()
        .expect("bad credentials are refused");
    assert_eq!(err.kind(), ErrorKind::Fatal, "{err}");
    let message = connector_api::Report(&err).to_string();
    assert!(message.contains("HTTP 403"), "{message}");
}
