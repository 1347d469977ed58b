//! S3: no object is visible before commit.
//!
//! An open file's bytes are staged in a local spill file (memory stays bounded whatever the file size); every full
//! part (`part_size`, at least 5 MiB) is uploaded as it fills, into a multipart upload started on the first part.
//! `seal` (pre-commit) uploads the remaining bytes as the last part and records key, upload id and part ETags; a
//! file smaller than one part instead goes whole with one PutObject under `<prefix>/_ratchet-staging/`. Commit
//! completes the upload with `If-None-Match: *` (or copies the staged object into place and deletes it); an object
//! already complete is success, verified with HEAD (size, and the multipart ETag's part count).
//! Recovery aborts every multipart upload and deletes every staged object and spill file this instance owns that
//! the restored checkpoint did not publish.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use aws_sdk_s3::Client;
use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::config::retry::RetryConfig;
use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
use connector_api::{Error, ErrorKind, Phase, Result, SinkScope, SubtaskId};

use super::{OpenFile, Stage, StageHandle, StagedFile, Upload, UploadedPart, age_since};
use crate::FileName;
use crate::config::{MIN_PART_SIZE, S3Config};

/// Staged small files live under this directory of the prefix; readers should skip `_`-prefixed directories, as
/// Hive, Spark and Trino do.
const STAGING_DIR: &str = "_ratchet-staging";
/// Attempts of one S3 request by the SDK's standard retry mode.
const S3_MAX_ATTEMPTS: u32 = 5;

/// Owner-epoch objects live here.
const OWNER_DIR: &str = "_ratchet";
/// Local spill files start with this.
const SPILL_PREFIX: &str = ".ratchet-spill-";

pub(crate) struct S3Backend {
    client: Client,
    bucket: String,
    prefix: String,
    part_size: u64,
    spill_dir: PathBuf,
    scope: SinkScope,
    subtask: SubtaskId,
}

/// What an S3 call failed with, as the driver needs it. `403`, a missing bucket and other client errors are
/// permanent and name the bucket and key; throttling, `5xx` and transport failures are retryable.
fn s3_error<E>(
    op: &str,
    bucket: &str,
    key: &str,
    phase: Phase,
    e: SdkError<E, HttpResponse>,
) -> Error
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let status = e.raw_response().map(|r| r.status().as_u16());
    let code = e.code().unwrap_or("").to_string();
    let kind = if transient(&e) {
        ErrorKind::Retryable
    } else {
        ErrorKind::Fatal
    };
    let hint = match (status, code.as_str()) {
        (Some(403), _) | (_, "AccessDenied") => {
            ": access denied; check the credentials and the bucket policy"
        }
        (_, "NoSuchBucket") => ": the bucket does not exist; create it or fix `bucket`",
        _ => "",
    };
    let status = status.map_or("no response".to_string(), |s| format!("HTTP {s}"));
    Error::new(
        kind,
        phase,
        format!("S3 {op} of s3://{bucket}/{key} failed ({status} {code}){hint}"),
    )
    .with_txn(format!("s3://{bucket}/{key}"))
    .with_source(e)
}

fn status_of<E>(e: &SdkError<E, HttpResponse>) -> Option<u16> {
    e.raw_response().map(|r| r.status().as_u16())
}

/// Throttling, `5xx` and transport failures: worth retrying.
fn transient<E: ProvideErrorMetadata>(e: &SdkError<E, HttpResponse>) -> bool {
    matches!(
        e,
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_)
    ) || matches!(status_of(e), Some(429 | 500..=599))
        || matches!(
            e.code(),
            Some("SlowDown" | "RequestTimeout" | "InternalError" | "ServiceUnavailable")
        )
}

/// Percent-encodes a key for `x-amz-copy-source` (everything but unreserved characters and `/`).
fn encode_copy_source(bucket: &str, key: &str) -> String {
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
const SHA256_METADATA: &str = "ratchet-sha256";

/// What a HEAD of a key says.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Head {
    size: u64,
    /// The ETag without quotes.
    etag: String,
    /// The content SHA-256 a staged object carries in its metadata.
    sha256: Option<String>,
}

/// What a HEAD of the visible key says after CompleteMultipartUpload answered 412 (the key exists) or 404 (the
/// upload is gone): whether our upload completed before (a retried commit, or recovery after a crash mid-commit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Completion {
    /// The key holds our file: same size, and a multipart ETag of the same part count (`<md5>-<parts>`; a
    /// single-part upload may carry a plain ETag).
    Ours,
    /// The key holds something else: never overwritten.
    Foreign,
    /// No object: the upload is gone without having completed (lost).
    Absent,
}

fn multipart_completion(head: Option<&Head>, bytes: u64, parts: usize) -> Completion {
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
fn staged_completion(
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
fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// FNV-1a, to keep spill file names of different destinations and partitions apart.
fn fnv(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// An S3 client for `config` (its endpoint, region, credentials or the AWS chain, addressing; the SDK's standard
/// retries of single requests), once the settings are checked and the bucket answered a HEAD: a wrong bucket or
/// credentials fail at start, not at the first checkpoint.
///
/// # Errors
/// [`Config`](ErrorKind::Config) for a part size below S3's minimum or half a key pair; the HEAD's error (a
/// missing bucket, refused credentials: named).
async fn checked_client(config: &S3Config) -> Result<Client> {
    if config.part_size < MIN_PART_SIZE {
        return Err(Error::new(
            ErrorKind::Config,
            Phase::Setup,
            format!(
                "part_size {} is below S3's minimum of {MIN_PART_SIZE} bytes",
                config.part_size
            ),
        ));
    }
    let mut loader = aws_config::defaults(BehaviorVersion::latest());
    if let Some(region) = &config.region {
        loader = loader.region(Region::new(region.clone()));
    }
    if let Some(endpoint) = &config.endpoint {
        loader = loader.endpoint_url(endpoint);
    }
    match (&config.access_key_id, &config.secret_access_key) {
        (Some(id), Some(secret)) => {
            loader = loader.credentials_provider(Credentials::new(
                id,
                secret,
                None,
                None,
                "ratchet-config",
            ));
        }
        (None, None) => {}
        _ => {
            return Err(Error::new(
                ErrorKind::Config,
                Phase::Setup,
                "set both access_key_id and secret_access_key, or neither (to use the AWS credential chain)",
            ));
        }
    }
    let shared = loader.load().await;
    // The SDK retries single requests on throttling, 5xx and transport errors (its standard mode, configured
    // here); the driver's retry layer retries protocol steps. Nothing else wraps S3 calls in retries.
    let mut builder = aws_sdk_s3::config::Builder::from(&shared)
        .force_path_style(config.force_path_style)
        .retry_config(RetryConfig::standard().with_max_attempts(S3_MAX_ATTEMPTS));
    if shared.region().is_none() {
        builder = builder.region(Region::new("us-east-1"));
    }
    let client = Client::from_conf(builder.build());
    client
        .head_bucket()
        .bucket(&config.bucket)
        .send()
        .await
        .map_err(|e| s3_error("HeadBucket", &config.bucket, "", Phase::Setup, e))?;
    Ok(client)
}

/// `ratchet check-config` for an S3 storage: the bucket answers a HEAD (read-only; nothing is written).
///
/// # Errors
/// As [`S3Backend::connect`]'s check of the bucket (a missing bucket, refused credentials: named).
pub(crate) async fn check(config: &S3Config) -> Result<String> {
    checked_client(config).await?;
    Ok(format!(
        "bucket s3://{}/{} answers",
        config.bucket,
        config.prefix.trim_matches('/')
    ))
}

impl S3Backend {
    pub(crate) async fn connect(
        config: &S3Config,
        scope: SinkScope,
        subtask: SubtaskId,
    ) -> Result<Self> {
        let client = checked_client(config).await?;
        let spill_dir = config.spill_dir.clone().unwrap_or_else(std::env::temp_dir);
        std::fs::create_dir_all(&spill_dir).map_err(|e| {
            Error::new(
                ErrorKind::Config,
                Phase::Setup,
                format!("cannot create spill_dir {}", spill_dir.display()),
            )
            .with_source(e)
        })?;
        Ok(Self {
            client,
            bucket: config.bucket.clone(),
            prefix: config.prefix.trim_matches('/').to_string(),
            part_size: config.part_size as u64,
            spill_dir,
            scope,
            subtask,
        })
    }

    fn key(&self, relative: &str) -> String {
        if self.prefix.is_empty() {
            relative.to_string()
        } else {
            format!("{}/{relative}", self.prefix)
        }
    }

    fn owner_key(&self) -> String {
        self.key(&format!(
            "{OWNER_DIR}/owner-{}.{}",
            self.scope, self.subtask
        ))
    }

    pub(crate) fn staging_path(&self, name: &FileName) -> Result<PathBuf> {
        Ok(self.spill_dir.join(format!(
            "{SPILL_PREFIX}{:016x}-{:016x}-{}",
            self.destination_hash(),
            fnv(&name.partition),
            name.visible()
        )))
    }

    /// Keeps the spill files of sinks writing to different buckets or prefixes apart in a shared spill directory.
    fn destination_hash(&self) -> u64 {
        fnv(&format!("{}/{}", self.bucket, self.prefix))
    }

    /// The visible file a spill file `name` stages, when it is this destination's (or from a release whose spill
    /// names had no destination: `<partition hash>-<visible>`).
    fn spilled_file<'a>(&self, name: &'a str) -> Option<&'a str> {
        let (first, rest) = name.strip_prefix(SPILL_PREFIX)?.split_once('-')?;
        if rest.starts_with("part-") {
            return Some(rest);
        }
        let (_, file) = rest.split_once('-')?;
        (first == format!("{:016x}", self.destination_hash())).then_some(file)
    }

    async fn read_range(&self, path: &std::path::Path, offset: u64, len: u64) -> Result<Vec<u8>> {
        let path = path.to_path_buf();
        tokio::task::spawn_blocking(move || {
            let file = std::fs::File::open(&path)?;
            let mut buf = vec![0; len as usize];
            file.read_exact_at(&mut buf, offset)?;
            Ok::<_, std::io::Error>(buf)
        })
        .await
        .expect("read task panicked")
        .map_err(|e| {
            Error::new(
                ErrorKind::MustAbort,
                Phase::Write,
                "cannot read the spill file",
            )
            .with_source(e)
        })
    }

    async fn upload_part(
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

    async fn upload_ready(
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
        tokio::task::spawn_blocking(move || writer.finish().map(drop))
            .await
            .expect("finish task panicked")
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

    async fn abort_upload(&self, key: &str, upload_id: &str, phase: Phase) -> Result<()> {
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

    /// HEAD of `key`, or `None` when absent.
    async fn head(&self, key: &str) -> Result<Option<Head>> {
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

    async fn delete(&self, key: &str, phase: Phase) -> Result<()> {
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

    /// The owner epoch and the owner object's ETag (for compare-and-swap).
    pub(crate) async fn read_epoch(&self) -> Result<(u64, Option<String>)> {
        let key = self.owner_key();
        match self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(&key)
            .send()
            .await
        {
            Ok(object) => {
                let etag = object.e_tag().map(str::to_string);
                let body = object.body.collect().await.map_err(|e| {
                    Error::new(
                        ErrorKind::Retryable,
                        Phase::Recover,
                        format!("cannot read s3://{}/{key}", self.bucket),
                    )
                    .with_source(e)
                })?;
                let text = String::from_utf8_lossy(&body.into_bytes())
                    .trim()
                    .to_string();
                let epoch = text.parse().map_err(|e| {
                    Error::new(
                        ErrorKind::Fatal,
                        Phase::Recover,
                        format!("s3://{}/{key} holds {text:?}, not an epoch", self.bucket),
                    )
                    .with_source(e)
                })?;
                Ok((epoch, etag))
            }
            Err(e) if status_of(&e) == Some(404) => Ok((0, None)),
            Err(e) => Err(s3_error("GetObject", &self.bucket, &key, Phase::Recover, e)),
        }
    }

    /// Raises the owner epoch with a conditional write (If-Match the old ETag, or If-None-Match when new), so two
    /// instances recovering at once cannot both take the same epoch.
    pub(crate) async fn bump_epoch(&self) -> Result<u64> {
        let key = self.owner_key();
        for _ in 0..10 {
            let (epoch, etag) = self.read_epoch().await?;
            let next = epoch + 1;
            let put = self
                .client
                .put_object()
                .bucket(&self.bucket)
                .key(&key)
                .body(ByteStream::from(next.to_string().into_bytes()));
            let put = match &etag {
                Some(etag) => put.if_match(etag),
                None => put.if_none_match("*"),
            };
            match put.send().await {
                Ok(_) => return Ok(next),
                Err(e) if matches!(status_of(&e), Some(412 | 409)) => continue,
                Err(e) => return Err(s3_error("PutObject", &self.bucket, &key, Phase::Recover, e)),
            }
        }
        Err(Error::new(
            ErrorKind::Retryable,
            Phase::Recover,
            format!(
                "s3://{}/{key} kept changing: other instances of this sink are recovering at the same time",
                self.bucket
            ),
        ))
    }

    fn owns_key(&self, key: &str) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn head(size: u64, etag: &str) -> Option<Head> {
        Some(Head {
            size,
            etag: etag.to_string(),
            sha256: None,
        })
    }

    #[test]
    fn a_staged_files_copy_is_recognised_by_its_content_checksum_whatever_its_etag() {
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
    fn a_completed_upload_is_recognised_by_size_and_part_count() {
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
