//! Shared test support: file sinks on a local directory or on SeaweedFS S3, and the Python verifier that reads
//! only what is visible there.

use std::path::PathBuf;

use connector_api::{SinkId, SubtaskId};
use file_sink::{FileSinkConfig, S3Config, StorageConfig};
use ratchet_conformance::conformance_schema;
use test_support::Services;

/// Where a test's files go.
#[derive(Clone)]
pub enum Place {
    /// Under a local directory.
    Local(PathBuf),
    /// Under a prefix of the test bucket.
    S3 { prefix: String },
}

impl Place {
    pub fn local() -> (Self, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        (Place::Local(dir.path().to_path_buf()), dir)
    }

    pub fn s3(test: &str) -> Self {
        Place::S3 {
            prefix: format!("file-sink-tests/{}", test_support::unique_name(test)),
        }
    }

    /// The storage of `sub` (a run or sink directory) within this place.
    pub fn storage(&self, sub: &str) -> StorageConfig {
        match self {
            Place::Local(dir) => StorageConfig::Local {
                path: dir.join(sub),
            },
            Place::S3 { prefix } => {
                let s3 = Services::get().s3();
                StorageConfig::S3(S3Config {
                    bucket: s3.bucket,
                    prefix: format!("{prefix}/{sub}"),
                    endpoint: Some(s3.endpoint),
                    region: Some(s3.region),
                    access_key_id: Some(s3.access_key),
                    secret_access_key: Some(s3.secret_key.into()),
                    force_path_style: true,
                    part_size: file_sink::MIN_PART_SIZE,
                    spill_dir: Some(std::env::temp_dir().join("ratchet-file-sink-tests")),
                })
            }
        }
    }

    /// What the independent verifier sees under `sub`: (ids of `column`, visible files, strays).
    pub fn read(&self, sub: &str, column: &str) -> (Vec<i64>, Vec<String>, Vec<String>) {
        let services = Services::get();
        let seen = match self {
            Place::Local(dir) => {
                let path = dir.join(sub).display().to_string();
                services.verify("visible_ids.py", &["local", &path, column])
            }
            Place::S3 { prefix } => {
                let bucket = services.s3().bucket;
                services.verify(
                    "visible_ids.py",
                    &["s3", &bucket, &format!("{prefix}/{sub}"), column],
                )
            }
        };
        let strings = |key: &str| -> Vec<String> {
            seen[key]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap().to_string())
                .collect()
        };
        let ids = seen["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_i64().unwrap())
            .collect();
        (ids, strings("files"), strings("strays"))
    }
}

/// A Parquet sink config with the conformance schema.
pub fn config(place: &Place, sub: &str, sink: &SinkId) -> FileSinkConfig {
    FileSinkConfig::new(
        sink.clone(),
        SubtaskId(0),
        conformance_schema(),
        place.storage(sub),
    )
}
