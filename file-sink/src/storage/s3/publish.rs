//! Commit: making a sealed file visible exactly once (complete the multipart upload, or copy the staged object into
//! place), recognising a file already published by its size and part count or its content checksum, never by an
//! ETag alone.

use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
use connector_api::{Error, ErrorKind, Phase, Result};

use super::S3Backend;
use super::error::{s3_error, status_of};
use crate::storage::StagedFile;

/// Percent-encodes a key for `x-amz-copy-source` (everything but unreserved characters and `/`).
pub(super) fn encode_copy_source(bucket: &str, key: &str) -> String {
    let mut out = format!("{bucket}/");
    for b in key.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The metadata key (`x-amz-meta-ratchet-sha256`) holding a staged object's content SHA-256.
pub(super) const SHA256_METADATA: &str = "ratchet-sha256";

/// What a HEAD of a key says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Head {
    size: u64,
    /// The ETag without quotes.
    etag: String,
    /// The content SHA-256 a staged object carries in its metadata.
    sha256: Option<String>,
}

/// What a HEAD of the visible key says after CompleteMultipartUpload answered 412 (the key exists) or 404 (the
/// upload is gone): whether our upload completed before (a retried commit, or recovery after a crash mid-commit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Completion {
    /// The key holds our file: same size, and a multipart ETag of the same part count (`<md5>-<parts>`; a
    /// single-part upload may carry a plain ETag).
    Ours,
    /// The key holds something else: never overwritten.
    Foreign,
    /// No object: the upload is gone without having completed (lost).
    Absent,
}

pub(super) fn multipart_completion(head: Option<&Head>, bytes: u64, parts: usize) -> Completion {
    match head {
        None => Completion::Absent,
        Some(head)
            if head.size == bytes && (head.etag.ends_with(&format!("-{parts}")) || parts == 1) =>
        {
            Completion::Ours
        }
        Some(_) => Completion::Foreign,
    }
}

/// Whether the visible key holds the copy of a staged small file: same size, and the content SHA-256 the staged
/// object carried in its metadata (the copy keeps it). The ETag is no proof: under SSE-KMS, SSE-C, or after a
/// multipart copy it is not an MD5 of the content, and every copy gets its own. Only a staged file from before the
/// SHA-256 was kept is recognised by its ETag (it was written to a bucket where that worked).
pub(super) fn staged_completion(
    head: Option<&Head>,
    bytes: u64,
    sha256: Option<&str>,
    etag: &str,
) -> Completion {
    match (head, sha256) {
        (None, _) => Completion::Absent,
        (Some(head), _) if head.size != bytes => Completion::Foreign,
        (Some(head), Some(ours)) if head.sha256.as_deref() == Some(ours) => Completion::Ours,
        (Some(head), None) if head.etag == etag.trim_matches('"') => Completion::Ours,
        (Some(_), _) => Completion::Foreign,
    }
}

/// The hex SHA-256 of `bytes`.
pub(super) fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl S3Backend {
    /// HEAD of `key`, or `None` when absent.
    pub(super) async fn head(&self, key: &str) -> Result<Option<Head>> {
        match self
            .client
            .head_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
        {
            Ok(head) => Ok(Some(Head {
                size: head.content_length().unwrap_or(0) as u64,
                etag: head
                    .e_tag()
                    .unwrap_or_default()
                    .trim_matches('"')
                    .to_string(),
                sha256: head
                    .metadata()
                    .and_then(|m| m.get(SHA256_METADATA))
                    .cloned(),
            })),
            Err(e) if status_of(&e) == Some(404) => Ok(None),
            Err(e) => Err(s3_error("HeadObject", &self.bucket, key, Phase::Commit, e)),
        }
    }

    pub(crate) async fn publish(&self, staged: &StagedFile) -> Result<()> {
        match staged {
            StagedFile::Multipart {
                key,
                upload_id,
                parts,
                bytes,
                ..
            } => {
                let completed = CompletedMultipartUpload::builder()
                    .set_parts(Some(
                        parts
                            .iter()
                            .map(|p| {
                                CompletedPart::builder()
                                    .part_number(p.number)
                                    .e_tag(&p.etag)
                                    .build()
                            })
                            .collect(),
                    ))
                    .build();
                let outcome = self
                    .client
                    .complete_multipart_upload()
                    .bucket(&self.bucket)
                    .key(key)
                    .upload_id(upload_id)
                    .multipart_upload(completed.clone())
                    .if_none_match("*")
                    .send()
                    .await;
                match outcome {
                    Ok(_) => Ok(()),
                    // 412: the key exists (completed before); 404: the upload is gone (completed before, or lost).
                    Err(e) if matches!(status_of(&e), Some(412 | 404)) => {
                        let head = self.head(key).await?;
                        match (multipart_completion(head.as_ref(), *bytes, parts.len()), head) {
                            (Completion::Ours, _) => Ok(()),
                            (Completion::Foreign, Some(found)) => Err(Error::new(
                                ErrorKind::Fatal,
                                Phase::Commit,
                                format!(
                                    "s3://{}/{key} exists but is not this file (size {} vs {bytes}, ETag {}): \
                                     something else wrote the key; not overwriting it",
                                    self.bucket, found.size, found.etag
                                ),
                            )
                            .with_txn(upload_id.clone())),
                            _ => Err(s3_error("CompleteMultipartUpload", &self.bucket, key, Phase::Commit, e)
                                .with_txn(upload_id.clone())),
                        }
                    }
                    Err(e) => Err(s3_error(
                        "CompleteMultipartUpload",
                        &self.bucket,
                        key,
                        Phase::Commit,
                        e,
                    )
                    .with_txn(upload_id.clone())),
                }
            }
            StagedFile::Staged {
                staging_key,
                key,
                etag,
                sha256,
                bytes,
                ..
            } => {
                let is_ours = |head: Option<&Head>| -> Result<bool> {
                    match staged_completion(head, *bytes, sha256.as_deref(), etag) {
                        Completion::Ours => Ok(true),
                        Completion::Absent => Ok(false),
                        Completion::Foreign => {
                            let head = head.expect("a foreign object exists");
                            Err(Error::new(
                                ErrorKind::Fatal,
                                Phase::Commit,
                                format!(
                                    "s3://{}/{key} exists but is not this file (size {} vs {bytes}, content \
                                     SHA-256 {} vs {}): not overwriting it",
                                    self.bucket,
                                    head.size,
                                    head.sha256.as_deref().unwrap_or("unknown"),
                                    sha256.as_deref().unwrap_or("unknown"),
                                ),
                            ))
                        }
                    }
                };
                if !is_ours(self.head(key).await?.as_ref())? {
                    let source = encode_copy_source(&self.bucket, staging_key);
                    let copied = self
                        .client
                        .copy_object()
                        .bucket(&self.bucket)
                        .key(key)
                        .copy_source(&source)
                        .if_none_match("*")
                        .send()
                        .await;
                    if let Err(e) = copied {
                        // 412: the key appeared since the HEAD (our own retried copy, a second committer).
                        let ours =
                            status_of(&e) == Some(412) && is_ours(self.head(key).await?.as_ref())?;
                        if !ours {
                            return Err(s3_error(
                                "CopyObject",
                                &self.bucket,
                                staging_key,
                                Phase::Commit,
                                e,
                            ));
                        }
                    }
                }
                self.delete(staging_key, Phase::Commit).await
            }
            StagedFile::Local { .. } => unreachable!("checked by Backend::publish"),
        }
    }

    pub(super) async fn delete(&self, key: &str, phase: Phase) -> Result<()> {
        self.client
            .delete_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
            .map(drop)
            .map_err(|e| s3_error("DeleteObject", &self.bucket, key, phase, e))
    }

    pub(crate) async fn is_published(&self, staged: &StagedFile) -> Result<bool> {
        match staged {
            StagedFile::Multipart { key, bytes, .. } => {
                Ok(self.head(key).await?.is_some_and(|h| h.size == *bytes))
            }
            StagedFile::Staged {
                key,
                bytes,
                sha256,
                etag,
                ..
            } => Ok(staged_completion(
                self.head(key).await?.as_ref(),
                *bytes,
                sha256.as_deref(),
                etag,
            ) == Completion::Ours),
            StagedFile::Local { .. } => Ok(false),
        }
    }

    pub(crate) async fn discard_staged(&self, staged: &StagedFile) -> Result<()> {
        match staged {
            StagedFile::Multipart { key, upload_id, .. } => {
                self.abort_upload(key, upload_id, Phase::Abort).await
            }
            StagedFile::Staged { staging_key, .. } => self.delete(staging_key, Phase::Abort).await,
            StagedFile::Local { .. } => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn head(size: u64, etag: &str) -> Option<Head> {
        Some(Head {
            size,
            etag: etag.to_string(),
            sha256: None,
        })
    }

    #[test]
    pub(super) fn a_staged_files_copy_is_recognised_by_its_content_checksum_whatever_its_etag() {
        let copy = |size: u64, etag: &str, sha256: &str| {
            Some(Head {
                size,
                etag: etag.to_string(),
                sha256: Some(sha256.to_string()),
            })
        };
        // SSE-KMS / SSE-C / a multipart copy: the copy's ETag is not the staged object's.
        assert_eq!(
            staged_completion(
                copy(10, "9f3a-1", "c0ffee").as_ref(),
                10,
                Some("c0ffee"),
                "\"ab12\""
            ),
            Completion::Ours
        );
        assert_eq!(
            staged_completion(
                copy(10, "ab12", "beef").as_ref(),
                10,
                Some("c0ffee"),
                "ab12"
            ),
            Completion::Foreign
        );
        assert_eq!(
            staged_completion(copy(9, "x", "c0ffee").as_ref(), 10, Some("c0ffee"), "x"),
            Completion::Foreign
        );
        // A same-size object someone else wrote, with no checksum: never taken for ours.
        assert_eq!(
            staged_completion(head(10, "ab12").as_ref(), 10, Some("c0ffee"), "ab12"),
            Completion::Foreign
        );
        // A committable from before the checksum was kept: the ETag decides, as it did.
        assert_eq!(
            staged_completion(head(10, "ab12").as_ref(), 10, None, "\"ab12\""),
            Completion::Ours
        );
        assert_eq!(
            staged_completion(None, 10, Some("c0ffee"), "ab12"),
            Completion::Absent
        );
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    pub(super) fn a_completed_upload_is_recognised_by_size_and_part_count() {
        assert_eq!(
            multipart_completion(head(100, "abc-3").as_ref(), 100, 3),
            Completion::Ours
        );
        assert_eq!(
            multipart_completion(head(100, "abc").as_ref(), 100, 1),
            Completion::Ours
        );
        // Another writer's object under our key: different size, or a different part count.
        assert_eq!(
            multipart_completion(head(99, "abc-3").as_ref(), 100, 3),
            Completion::Foreign
        );
        assert_eq!(
            multipart_completion(head(100, "abc-2").as_ref(), 100, 3),
            Completion::Foreign
        );
        assert_eq!(multipart_completion(None, 100, 3), Completion::Absent);
    }
}
