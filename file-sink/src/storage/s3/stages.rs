//! Recovery's view: the multipart uploads, staged objects and spill files this instance owns, and removing them.

use connector_api::{Phase, Result};

use super::error::s3_error;
use super::{S3Backend, STAGING_DIR};
use crate::FileName;
use crate::storage::{Stage, StageHandle, age_since};

impl S3Backend {
    pub(super) fn owns_key(&self, key: &str) -> bool {
        let name = key.rsplit('/').next().unwrap_or(key);
        FileName::is_owned(name, &self.scope, self.subtask)
    }

    pub(crate) async fn owned_stages(&self) -> Result<Vec<Stage>> {
        let mut stages = Vec::new();
        let scope = if self.prefix.is_empty() {
            String::new()
        } else {
            format!("{}/", self.prefix)
        };
        let last = |key: &str| key.rsplit('/').next().unwrap_or(key).to_string();
        let age = |t: Option<&aws_sdk_s3::primitives::DateTime>| {
            t.and_then(|t| std::time::SystemTime::try_from(*t).ok())
                .and_then(age_since)
        };
        // Open multipart uploads under the prefix.
        let (mut key_marker, mut upload_marker) = (None::<String>, None::<String>);
        loop {
            let page = self
                .client
                .list_multipart_uploads()
                .bucket(&self.bucket)
                .prefix(&scope)
                .set_key_marker(key_marker.clone())
                .set_upload_id_marker(upload_marker.clone())
                .send()
                .await
                .map_err(|e| {
                    s3_error(
                        "ListMultipartUploads",
                        &self.bucket,
                        &scope,
                        Phase::Recover,
                        e,
                    )
                })?;
            for upload in page.uploads() {
                let (Some(key), Some(id)) = (upload.key(), upload.upload_id()) else {
                    continue;
                };
                if self.owns_key(key) {
                    stages.push(Stage {
                        kind: "multipart upload",
                        location: format!("{id} of s3://{}/{key}", self.bucket),
                        file: last(key),
                        age: age(upload.initiated()),
                        handle: StageHandle::Upload {
                            key: key.to_string(),
                            upload_id: id.to_string(),
                        },
                    });
                }
            }
            if page.is_truncated() != Some(true) {
                break;
            }
            key_marker = page.next_key_marker().map(str::to_string);
            upload_marker = page.next_upload_id_marker().map(str::to_string);
        }
        // Staged small files.
        let staging = self.key(&format!("{STAGING_DIR}/"));
        let mut token = None::<String>;
        loop {
            let page = self
                .client
                .list_objects_v2()
                .bucket(&self.bucket)
                .prefix(&staging)
                .set_continuation_token(token.clone())
                .send()
                .await
                .map_err(|e| {
                    s3_error("ListObjectsV2", &self.bucket, &staging, Phase::Recover, e)
                })?;
            for object in page.contents() {
                let Some(key) = object.key() else { continue };
                if self.owns_key(key) {
                    stages.push(Stage {
                        kind: "staged object",
                        location: format!("s3://{}/{key}", self.bucket),
                        file: last(key),
                        age: age(object.last_modified()),
                        handle: StageHandle::Object {
                            key: key.to_string(),
                        },
                    });
                }
            }
            match page.next_continuation_token() {
                Some(next) if page.is_truncated() == Some(true) => token = Some(next.to_string()),
                _ => break,
            }
        }
        // Local spill files of crashed attempts.
        if let Ok(entries) = std::fs::read_dir(&self.spill_dir) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let Some(file) = self.spilled_file(&name) else {
                    continue;
                };
                if FileName::is_owned(file, &self.scope, self.subtask) {
                    stages.push(Stage {
                        kind: "spill file",
                        location: entry.path().display().to_string(),
                        file: file.to_string(),
                        age: entry
                            .metadata()
                            .ok()
                            .and_then(|m| m.modified().ok())
                            .and_then(age_since),
                        handle: StageHandle::Path(entry.path()),
                    });
                }
            }
        }
        Ok(stages)
    }

    pub(crate) async fn remove_stage(&self, handle: &StageHandle) -> Result<()> {
        match handle {
            StageHandle::Upload { key, upload_id } => {
                self.abort_upload(key, upload_id, Phase::Recover).await
            }
            StageHandle::Object { key } => self.delete(key, Phase::Recover).await,
            // A spill file another attempt already removed is fine.
            StageHandle::Path(path) => {
                let _ = std::fs::remove_file(path);
                Ok(())
            }
        }
    }
}
