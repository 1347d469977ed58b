//! Publishing a small file on S3 (a staged object copied into place) is idempotent whatever ETag the copy got,
//! against the real server (SeaweedFS), read back by the independent verifier (boto3 + pyarrow).
//!
//! Under SSE-KMS or SSE-C, or when the copy was made by a multipart copy, the visible object's ETag is not the
//! MD5 of its content and differs from the staged object's. SeaweedFS always answers an MD5 for `PutObject` and
//! `CopyObject` (with or without SSE), so the test makes the copy the way that gives it another ETag here too: a
//! multipart copy (`UploadPartCopy`) of the staged object, keeping its metadata, exactly the state a crash
//! between the copy and the deletion of the staged object leaves on such a bucket.

use crate::common;

use aws_sdk_s3::Client;
use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
use common::{Place, config};
use connector_api::{CheckpointId, ErrorKind, SinkId, TwoPhaseCommit};
use file_sink::{FileSink, FormatConfig, StagedFile};
use ratchet_conformance::conformance_batch;
use test_support::Services;

fn client() -> Client {
    let s3 = Services::get().s3();
    let config = aws_sdk_s3::config::Builder::new()
        .behavior_version(BehaviorVersion::latest())
        .endpoint_url(s3.endpoint)
        .region(Region::new(s3.region))
        .credentials_provider(Credentials::new(
            s3.access_key,
            s3.secret_key,
            None,
            None,
            "test",
        ))
        .force_path_style(true)
        .build();
    Client::from_conf(config)
}

/// A small file pre-committed as checkpoint 2 by a sink that then died: its committable.
async fn staged(place: &Place, sub: &str, ids: std::ops::Range<i64>) -> file_sink::FileCommittable {
    let mut config = config(place, sub, &SinkId::new("small").unwrap());
    config.format = FormatConfig::JsonLines;
    let mut sink = FileSink::new(config).await.unwrap();
    sink.recover(None).await.unwrap();
    sink.begin(CheckpointId(2)).await.unwrap();
    sink.write(&conformance_batch(ids)).await.unwrap();
    sink.pre_commit(CheckpointId(2)).await.unwrap()
}

fn keys(committable: &file_sink::FileCommittable) -> (String, String, String) {
    match &committable.files[..] {
        [
            StagedFile::Staged {
                bucket,
                staging_key,
                key,
                ..
            },
        ] => (bucket.clone(), staging_key.clone(), key.clone()),
        other => panic!("expected one staged small file, got {other:?}"),
    }
}

async fn exists(s3: &Client, bucket: &str, key: &str) -> bool {
    s3.head_object()
        .bucket(bucket)
        .key(key)
        .send()
        .await
        .is_ok()
}

async fn recover(
    place: &Place,
    sub: &str,
    committable: file_sink::FileCommittable,
) -> connector_api::Result<()> {
    let mut config = config(place, sub, &SinkId::new("small").unwrap());
    config.format = FormatConfig::JsonLines;
    let mut sink = FileSink::new(config).await.unwrap();
    sink.recover(Some((CheckpointId(2), vec![committable])))
        .await
}

#[tokio::test]
async fn a_copy_with_another_etag_is_recognised_as_published() {
    let place = Place::s3("etag");
    let committable = staged(&place, "out", 0..50).await;
    let (bucket, staging_key, key) = keys(&committable);
    let s3 = client();

    // The copy into place, as a multipart copy: same bytes and metadata, an ETag of the form `<md5>-1`.
    let source = s3
        .head_object()
        .bucket(&bucket)
        .key(&staging_key)
        .send()
        .await
        .unwrap();
    let upload = s3
        .create_multipart_upload()
        .bucket(&bucket)
        .key(&key)
        .set_metadata(source.metadata().cloned())
        .send()
        .await
        .unwrap();
    let upload_id = upload.upload_id().unwrap();
    let part = s3
        .upload_part_copy()
        .bucket(&bucket)
        .key(&key)
        .upload_id(upload_id)
        .part_number(1)
        .copy_source(format!("{bucket}/{staging_key}"))
        .send()
        .await
        .unwrap();
    let etag = part
        .copy_part_result()
        .unwrap()
        .e_tag()
        .unwrap()
        .to_string();
    s3.complete_multipart_upload()
        .bucket(&bucket)
        .key(&key)
        .upload_id(upload_id)
        .multipart_upload(
            CompletedMultipartUpload::builder()
                .parts(CompletedPart::builder().part_number(1).e_tag(etag).build())
                .build(),
        )
        .send()
        .await
        .unwrap();
    let visible = s3
        .head_object()
        .bucket(&bucket)
        .key(&key)
        .send()
        .await
        .unwrap();
    assert_ne!(
        visible.e_tag().unwrap(),
        source.e_tag().unwrap(),
        "the copy must carry another ETag for this test to mean anything"
    );

    // The process died before deleting the staged object; recovery publishes the decided checkpoint again.
    recover(&place, "out", committable.clone()).await.unwrap();
    recover(&place, "out", committable).await.unwrap();
    let (ids, files, strays) = place.read("out", "id");
    let mut ids = ids;
    ids.sort_unstable();
    assert_eq!(ids, (0..50).collect::<Vec<_>>());
    assert_eq!(files.len(), 1, "{files:?}");
    assert!(strays.is_empty(), "{strays:?}");
    assert!(
        !exists(&s3, &bucket, &staging_key).await,
        "the staged object stays behind"
    );
}

#[tokio::test]
async fn another_object_of_the_same_size_under_the_key_is_never_taken_for_ours() {
    let place = Place::s3("foreign");
    let committable = staged(&place, "out", 0..50).await;
    let (bucket, staging_key, key) = keys(&committable);
    let s3 = client();
    let size = s3
        .head_object()
        .bucket(&bucket)
        .key(&staging_key)
        .send()
        .await
        .unwrap()
        .content_length()
        .unwrap() as usize;
    s3.put_object()
        .bucket(&bucket)
        .key(&key)
        .body(vec![b'x'; size].into())
        .send()
        .await
        .unwrap();
    let err = recover(&place, "out", committable).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Fatal, "{err}");
    assert!(
        err.to_string().contains("is not this file"),
        "{}",
        connector_api::Report(&err)
    );
    assert!(
        exists(&s3, &bucket, &staging_key).await,
        "the staged object must stay while its publish is refused"
    );
}
