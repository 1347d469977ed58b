//! What the file sink stores in a checkpoint record (format version 1): the persisted types, and a golden-file test
//! that this release still reads what it wrote, older forms included (`testdata/committable-v1.json`).

use std::path::PathBuf;

use connector_api::CheckpointId;
use serde::{Deserialize, Serialize};

/// What commits one checkpoint's files: every sealed file, with where it waits. Enough for any process to finish
/// the commit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileCommittable {
    /// The checkpoint the files belong to.
    pub checkpoint: CheckpointId,
    /// The sealed files (none when the checkpoint wrote no rows).
    pub files: Vec<StagedFile>,
}

/// One uploaded part of a multipart upload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UploadedPart {
    /// Part number, from 1.
    pub number: i32,
    /// The ETag S3 returned for it.
    pub etag: String,
}

/// A sealed file waiting for commit: everything needed to make it visible, from any process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum StagedFile {
    /// A local file: `.<name>.pending` next to `path`, renamed to `path` at commit.
    Local {
        /// The visible path.
        path: PathBuf,
        /// Rows in the file.
        rows: u64,
        /// Bytes in the file.
        bytes: u64,
    },
    /// An S3 multipart upload, invisible until completed at commit.
    Multipart {
        /// Bucket.
        bucket: String,
        /// The visible key.
        key: String,
        /// The upload id.
        upload_id: String,
        /// Every part, in order.
        parts: Vec<UploadedPart>,
        /// Rows in the file.
        rows: u64,
        /// Bytes in the file.
        bytes: u64,
    },
    /// A small file put whole under a staging key, copied into place and deleted at commit.
    Staged {
        /// Bucket.
        bucket: String,
        /// Where it waits.
        staging_key: String,
        /// The visible key.
        key: String,
        /// Its ETag.
        etag: String,
        /// SHA-256 of its content (hex), also in its metadata (`x-amz-meta-ratchet-sha256`), which the copy keeps:
        /// how a later publish recognises its own copy whatever the copy's ETag is (not an MD5 of the content
        /// under SSE-KMS, SSE-C or a multipart copy). Absent in committables written before it was kept.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sha256: Option<String>,
        /// Rows in the file.
        rows: u64,
        /// Bytes in the file.
        bytes: u64,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What this release writes, format version 1, kept as a file: if a change to the persisted types makes this
    /// fail, raise the sink's `committable_version`, teach its `decode_committable` to read version 1, and add the
    /// new version's golden file beside this one (checkpoints written by older releases must stay readable).
    const V1: &str = include_str!("../testdata/committable-v1.json");

    #[test]
    fn format_version_1_still_reads_and_writes_back_the_same() {
        let golden: Vec<FileCommittable> = serde_json::from_str(V1).unwrap();
        assert_eq!(
            serde_json::to_value(&golden).unwrap(),
            serde_json::from_str::<serde_json::Value>(V1).unwrap()
        );
        assert!(matches!(
            &golden[0].files[0],
            StagedFile::Local { rows: 500, .. }
        ));
        assert!(
            matches!(&golden[0].files[1], StagedFile::Multipart { parts, .. } if parts.len() == 2)
        );
        assert!(matches!(
            &golden[0].files[2],
            StagedFile::Staged {
                sha256: Some(_),
                ..
            }
        ));
        // Written before the content checksum was kept: still read, without one.
        assert!(matches!(
            &golden[1].files[0],
            StagedFile::Staged { sha256: None, .. }
        ));
        assert!(golden[2].files.is_empty());
    }
}
