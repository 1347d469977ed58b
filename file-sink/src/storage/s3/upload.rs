//! The write path: an open file's bytes staged in a local spill file, full parts uploaded into a multipart upload as
//! they fill, and `seal` (pre-commit) finishing the upload's parts or putting a small file whole under the staging
//! directory.

use std::os::unix::fs::FileExt;
use std::path::Path;

use aws_sdk_s3::primitives::ByteStream;
use connector_api::{Error, ErrorKind, Phase, Result};

use super::error::{s3_error, status_of};
use super::publish::{SHA256_METADATA, sha256_hex};
use super::{S3Backend, STAGING_DIR};
use crate::FileName;
use crate::config::MIN_PART_SIZE;
use crate::storage::{OpenFile, StagedFile, Upload, UploadedPart};

impl S3Backend {
    pub(super) async fn read_range(
        &self,
        path: &std::path::Path,
        offset: u64,
        len: u64,
    ) -> Result<Vec<u8>> {
        let path = path.to_path_buf();
        connector_api::blocking(Phase::PreCommit, "reading the spill file", move || {
            let file = std::fs::File::open(&path)?;
            let mut buf = vec![0; len as usize];
            file.read_exact_at(&mut buf, offset)?;
            Ok::<_, std::io::Error>(buf)
        })
        .await?
        .map_err(|e| {
            Error::new(
                ErrorKind::MustAbort,
                Phase::Write,
                "cannot read the spill file",
            )
            .with_source(e)
        })
    }

    pub(super) async fn upload_part(
        &self,
        name: &FileName,
        spill: &Path,
        upload: &mut Option<Upload>,
        len: u64,
    ) -> Result<()> {
        let key = self.key(&name.relative_path());
        if upload.is_none() {
            let created = self
                .client
                .create_multipart_upload()
                .bucket(&self.bucket)
                .key(&key)
                .send()
                .await
                .map_err(|e| {
                    s3_error("CreateMultipartUpload", &self.bucket, &key, Phase::Write, e)
                })?;
            let upload_id = created.upload_id().unwrap_or_default().to_string();
            *upload = Some(Upload {
                key: key.clone(),
                upload_id,
                parts: Vec::new(),
                uploaded: 0,
            });
        }
        let upload = upload.as_mut().expect("created above");
        let bytes = self.read_range(spill, upload.uploaded, len).await?;
        let number = upload.parts.len() as i32 + 1;
        let done = self
            .client
            .upload_part()
            .bucket(&self.bucket)
            .key(&upload.key)
            .upload_id(&upload.upload_id)
            .part_number(number)
            .body(ByteStream::from(bytes.clone()))
            .send()
            .await
            .map_err(|e| {
                s3_error("UploadPart", &self.bucket, &upload.key, Phase::Write, e)
                    .with_txn(upload.upload_id.clone())
            })?;
        upload.parts.push(UploadedPart {
            number,
            etag: done.e_tag().unwrap_or_default().to_string(),
        });
        upload.uploaded += len;
        Ok(())
    }

    /// Uploads every full part the spill file holds beyond what is uploaded.
    pub(crate) async fn upload_full_parts(&self, open: &mut OpenFile) -> Result<()> {
        self.upload_ready(
            &open.name,
            &open.staging_path,
            &mut open.upload,
            open.written.flushed(),
        )
        .await
    }

    pub(super) async fn upload_ready(
        &self,
        name: &FileName,
        spill: &Path,
        upload: &mut Option<Upload>,
        written: u64,
    ) -> Result<()> {
        loop {
            let uploaded = upload.as_ref().map_or(0, |u| u.uploaded);
            if written - uploaded < self.part_size {
                return Ok(());
            }
            self.upload_part(name, spill, upload, self.part_size)
                .await?;
        }
    }

    pub(crate) async fn seal(&self, open: OpenFile) -> Result<StagedFile> {
        let OpenFile {
            name,
            writer,
            written,
            rows,
            staging_path,
            mut upload,
        } = open;
        // Finish the encoding (Parquet footer) into the spill file.
        connector_api::blocking(Phase::PreCommit, "finishing the encoding", move || {
            writer.finish().map(drop)
        })
        .await?
        .map_err(|e| {
            Error::new(
                ErrorKind::MustAbort,
                Phase::PreCommit,
                format!("cannot finish {}", name.visible()),
            )
            .with_source(std::io::Error::other(e))
        })?;
        let total = written.flushed();
        let key = self.key(&name.relative_path());
        let staged = if upload.is_none() && total < MIN_PART_SIZE as u64 {
            let staging_key = self.key(&format!("{STAGING_DIR}/{}", name.relative_path()));
            let body = self.read_range(&staging_path, 0, total).await?;
            let sha256 = sha256_hex(&body);
            let put = self
                .client
                .put_object()
                .bucket(&self.bucket)
                .key(&staging_key)
                .metadata(SHA256_METADATA, &sha256)
                .body(ByteStream::from(body.clone()))
                .send()
                .await
                .map_err(|e| {
                    s3_error("PutObject", &self.bucket, &staging_key, Phase::PreCommit, e)
                })?;
            StagedFile::Staged {
                bucket: self.bucket.clone(),
                staging_key,
                key,
                etag: put.e_tag().unwrap_or_default().to_string(),
                sha256: Some(sha256),
                rows,
                bytes: total,
            }
        } else {
            self.upload_ready(&name, &staging_path, &mut upload, total)
                .await?;
            let uploaded = upload.as_ref().map_or(0, |u| u.uploaded);
            if total > uploaded || upload.is_none() {
                self.upload_part(&name, &staging_path, &mut upload, total - uploaded)
                    .await?;
            }
            let upload = upload.expect("at least one part uploaded");
            StagedFile::Multipart {
                bucket: self.bucket.clone(),
                key: upload.key,
                upload_id: upload.upload_id,
                parts: upload.parts,
                rows,
                bytes: total,
            }
        };
        let _ = std::fs::remove_file(&staging_path);
        Ok(staged)
    }

    pub(crate) async fn discard_open(&self, open: OpenFile) -> Result<()> {
        let OpenFile {
            staging_path,
            upload,
            ..
        } = open;
        let _ = std::fs::remove_file(&staging_path);
        if let Some(upload) = upload {
            self.abort_upload(&upload.key, &upload.upload_id, Phase::Abort)
                .await?;
        }
        Ok(())
    }

    pub(super) async fn abort_upload(
        &self,
        key: &str,
        upload_id: &str,
        phase: Phase,
    ) -> Result<()> {
        match self
            .client
            .abort_multipart_upload()
            .bucket(&self.bucket)
            .key(key)
            .upload_id(upload_id)
            .send()
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if status_of(&e) == Some(404) => Ok(()),
            Err(e) => Err(
                s3_error("AbortMultipartUpload", &self.bucket, key, phase, e)
                    .with_txn(upload_id.to_string()),
            ),
        }
    }
}
