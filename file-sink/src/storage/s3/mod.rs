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
//!
//! Layout: this file (the client, keys, the owner epoch), `upload.rs` (the write path and `seal`), `publish.rs`
//! (commit and its idempotence check), `stages.rs` (what recovery finds and removes), `error.rs` (S3 errors as the
//! driver needs them).

use std::path::PathBuf;

use aws_sdk_s3::Client;
use aws_sdk_s3::config::retry::RetryConfig;
use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_s3::primitives::ByteStream;
use connector_api::{Error, ErrorKind, Phase, Result, SinkScope, SubtaskId};

use crate::FileName;
use crate::config::{MIN_PART_SIZE, S3Config};

mod error;
mod publish;
mod stages;
mod upload;

use self::error::{s3_error, status_of};

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
    if let Some(pair) = config.credentials()? {
        loader = loader.credentials_provider(Credentials::new(
            pair.access_key_id,
            pair.secret_access_key.expose(),
            None,
            None,
            "ratchet-config",
        ));
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
}
