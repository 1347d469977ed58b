//! Which catalog and table the sink commits to, and how it writes.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use connector_api::{Error, ErrorKind, Phase, Result, RetryPolicy, SinkId, SubtaskId};
use connector_common::Secret;
use connector_common::config::redact_url;
use connector_common::s3::S3Credentials;
use iceberg::{Catalog, CatalogBuilder};
use iceberg_catalog_rest::RestCatalogBuilder;
use iceberg_catalog_sql::{
    SQL_CATALOG_PROP_BIND_STYLE, SQL_CATALOG_PROP_URI, SQL_CATALOG_PROP_WAREHOUSE,
    SqlCatalogBuilder,
};
use iceberg_storage_opendal::OpenDalResolvingStorageFactory;
use serde::Deserialize;

use crate::error::setup_kind;
use crate::metadata_swap::SqlMetadataSwap;
use crate::own_commit::OwnCommit;
use crate::rest_commit::RestCommit;
pub use crate::upsert_deletes::UpsertDeletes;

/// An Iceberg catalog.
///
/// | kind | keys |
/// |---|---|
/// | `sql` | `uri` (`sqlite:///path/catalog.db?mode=rwc` or `postgres://user:pass@host:port/db`), `warehouse` (`file:///path` or `s3://bucket/prefix`) |
/// | `rest` | `uri` (`http://host:port`), `warehouse` (optional: the server may pick it), `credential_env` (the environment variable holding the OAuth2 client credential `client_id:secret`), `props` (passed to the REST client, e.g. `token`, `oauth2-server-uri`, `scope`) |
#[derive(Clone, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum CatalogConfig {
    /// iceberg-rust's SQL catalog (the same tables pyiceberg's `SqlCatalog` reads).
    Sql {
        /// Database URI.
        uri: String,
        /// Warehouse location for new tables.
        warehouse: String,
    },
    /// An Iceberg REST catalog.
    Rest {
        /// Catalog endpoint.
        uri: String,
        /// Warehouse name or location.
        #[serde(default)]
        warehouse: Option<String>,
        /// The environment variable holding the OAuth2 client credential (`client_id:secret`).
        #[serde(default)]
        credential_env: Option<String>,
        /// Extra client properties.
        #[serde(default)]
        props: HashMap<String, String>,
    },
}

impl std::fmt::Debug for CatalogConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CatalogConfig::Sql { uri, warehouse } => f
                .debug_struct("Sql")
                .field("uri", &redact_url(uri))
                .field("warehouse", warehouse)
                .finish(),
            CatalogConfig::Rest {
                uri,
                warehouse,
                credential_env,
                props,
            } => {
                // Values of client properties may be secrets (`credential`, `token`): only the keys are shown.
                let keys: Vec<&String> = props.keys().collect();
                f.debug_struct("Rest")
                    .field("uri", &redact_url(uri))
                    .field("warehouse", warehouse)
                    .field("credential_env", credential_env)
                    .field("props", &keys)
                    .finish()
            }
        }
    }
}

/// Credentials and addressing for an `s3://` warehouse (data and metadata files), as in the file sink. Leave the
/// keys out to take them from `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct S3Settings {
    /// Endpoint URL for S3-compatible stores.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// Signing region.
    #[serde(default)]
    pub region: Option<String>,
    /// Access key id.
    #[serde(default)]
    pub access_key_id: Option<String>,
    /// Secret access key (never shown in `Debug` output or logs).
    #[serde(default)]
    pub secret_access_key: Option<Secret<String>>,
    /// Path-style addressing (`http://host/bucket/key`), needed by most S3-compatible stores.
    #[serde(default)]
    pub force_path_style: bool,
}

impl S3Settings {
    /// The static credentials, when both keys are set.
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) when only one of them is set.
    pub fn credentials(&self) -> Result<Option<S3Credentials>> {
        Ok(S3Credentials::from_settings(
            self.access_key_id.as_deref(),
            self.secret_access_key.as_ref(),
        )?)
    }

    /// The FileIO properties (`s3.*`) iceberg's OpenDAL storage reads.
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) when only one of the two keys is set.
    pub fn file_io_props(&self) -> Result<HashMap<String, String>> {
        let mut props = HashMap::new();
        let mut put = |key: &str, value: &Option<String>| {
            if let Some(value) = value {
                props.insert(key.to_string(), value.clone());
            }
        };
        put(iceberg::io::S3_ENDPOINT, &self.endpoint);
        put(iceberg::io::S3_REGION, &self.region);
        if let Some(pair) = self.credentials()? {
            props.insert(
                iceberg::io::S3_ACCESS_KEY_ID.to_string(),
                pair.access_key_id,
            );
            props.insert(
                iceberg::io::S3_SECRET_ACCESS_KEY.to_string(),
                pair.secret_access_key.expose().clone(),
            );
        }
        if self.force_path_style {
            props.insert(iceberg::io::S3_PATH_STYLE_ACCESS.to_string(), "true".into());
        }
        Ok(props)
    }
}

impl CatalogConfig {
    /// Connects to the catalog named `name` (the SQL catalog's `catalog_name` column; pyiceberg must use the same).
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) naming the catalog when it cannot be opened.
    pub async fn open(&self, name: &str, s3: &S3Settings) -> Result<Arc<dyn Catalog>> {
        let storage = Arc::new(OpenDalResolvingStorageFactory::new());
        let mut props = s3.file_io_props()?;
        let catalog: Arc<dyn Catalog> = match self {
            CatalogConfig::Sql { uri, warehouse } => {
                let bind_style = if uri.starts_with("sqlite:") {
                    "QMark"
                } else {
                    "DollarNumeric"
                };
                props.insert(SQL_CATALOG_PROP_URI.to_string(), uri.clone());
                // Without a trailing `/`: table locations are `<warehouse>/<namespace>/<table>`, and a manifest
                // spelling `wh//ns/t` while storage lists `wh/ns/t` once made cleanup delete committed files.
                props.insert(
                    SQL_CATALOG_PROP_WAREHOUSE.to_string(),
                    warehouse.trim_end_matches('/').to_string(),
                );
                props.insert(SQL_CATALOG_PROP_BIND_STYLE.to_string(), bind_style.into());
                // Opening creates the catalog's tables when the database has none yet (`CREATE TABLE IF NOT
                // EXISTS`), which instances opening a fresh database at once race on (PostgreSQL refuses the
                // loser with a unique violation in `pg_type`): the loser opens again and finds them.
                let what = format!("opening SQL catalog {}", redact_url(uri));
                let catalog = SQL_OPEN_RETRY
                    .run(&what, || {
                        let (storage, props) = (storage.clone(), props.clone());
                        async move {
                            SqlCatalogBuilder::default()
                                .with_storage_factory(storage)
                                .load(name, props)
                                .await
                                .map_err(|e| {
                                    setup_error(
                                        format!("cannot open SQL catalog {}", redact_url(uri)),
                                        e,
                                    )
                                })
                        }
                    })
                    .await?;
                Arc::new(catalog)
            }
            CatalogConfig::Rest { uri, .. } => {
                props.extend(self.rest_props()?);
                let catalog = RestCatalogBuilder::default()
                    .with_storage_factory(storage)
                    .load(name, props)
                    .await
                    .map_err(|e| {
                        setup_error(format!("cannot open REST catalog {}", redact_url(uri)), e)
                    })?;
                Arc::new(catalog)
            }
        };
        Ok(catalog)
    }
}

impl CatalogConfig {
    /// Ratchet's own commit to this catalog for the catalog named `name`: a SQL catalog's compare-and-swap on the
    /// same database ([`crate::metadata_swap`]), a REST catalog's commit endpoint ([`crate::rest_commit`]).
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) when the database URI is malformed.
    pub(crate) fn own_commit(&self, name: &str) -> Result<OwnCommit> {
        match self {
            CatalogConfig::Sql { uri, .. } => {
                SqlMetadataSwap::connect(uri, name, !uri.starts_with("sqlite:"))
                    .map(OwnCommit::Sql)
                    .map_err(|e| {
                        setup_error(format!("cannot open SQL catalog {}", redact_url(uri)), e)
                    })
            }
            CatalogConfig::Rest { uri, warehouse, .. } => {
                Ok(OwnCommit::Rest(Arc::new(RestCommit::new(
                    uri,
                    warehouse
                        .as_ref()
                        .map(|w| w.trim_end_matches('/').to_string()),
                    self.rest_props()?,
                ))))
            }
        }
    }

    /// The REST catalog client's properties: the configured ones, the credential from its environment variable,
    /// `uri` and the warehouse without a trailing `/` (empty for a SQL catalog).
    fn rest_props(&self) -> Result<HashMap<String, String>> {
        let CatalogConfig::Rest {
            uri,
            warehouse,
            credential_env,
            props: extra,
        } = self
        else {
            return Ok(HashMap::new());
        };
        let mut props = extra.clone();
        if let Some(variable) = credential_env {
            #[allow(clippy::disallowed_methods)] // the setting names the variable to read
            let credential = std::env::var(variable).map_err(|_| {
                Error::new(
                    ErrorKind::Config,
                    Phase::Setup,
                    format!(
                        "credential_env names {variable:?}, which is not set: export it as \
                         `client_id:secret` for the REST catalog {}",
                        redact_url(uri)
                    ),
                )
            })?;
            props.insert("credential".into(), credential);
        }
        props.insert("uri".into(), uri.clone());
        if let Some(warehouse) = warehouse {
            props.insert(
                "warehouse".into(),
                warehouse.trim_end_matches('/').to_string(),
            );
        }
        Ok(props)
    }
}

/// Opening a catalog failed. A setting iceberg or the catalog refuses is a configuration error; anything else
/// (the server unreachable or restarting, a connection reset, a time-out, a 5xx) may pass by itself: retryable,
/// so the subtask is restarted (up to `max_restarts`) rather than the job stopped at once ([`setup_kind`]).
fn setup_error(message: String, e: iceberg::Error) -> Error {
    Error::new(
        setup_kind(&e),
        Phase::Setup,
        format!("{message}: check the catalog's address, credentials and that it is running"),
    )
    .with_source(e)
}

/// Everything one sink instance needs.
#[derive(Debug, Clone)]
pub struct IcebergSinkConfig {
    /// The stable job identity recorded in every snapshot (must not change when the process restarts or is
    /// replaced: it is how recovery recognises the job's snapshots).
    pub job: SinkId,
    /// The sink.
    pub sink: SinkId,
    /// The subtask this instance serves.
    pub subtask: SubtaskId,
    /// The Arrow schema of the batches (used to create the table when `create_table`).
    pub schema: arrow_schema::SchemaRef,
    /// The catalog.
    pub catalog: CatalogConfig,
    /// The catalog's name.
    pub catalog_name: String,
    /// S3 settings for an `s3://` warehouse.
    pub s3: S3Settings,
    /// The table, `namespace.name` (nested namespaces: `a.b.name`).
    pub table: String,
    /// Create the namespace and an unpartitioned table from the batches' schema when missing.
    pub create_table: bool,
    /// Add the batches' columns the table lacks (at start, and when the batches' schema gains columns).
    pub evolution: connector_api::Evolution,
    /// Roll to a new data file past this many bytes.
    pub target_file_size: usize,
    /// Commit a snapshot every this many checkpoints (1: every checkpoint); the files of the checkpoints in
    /// between are carried in the committables.
    pub commit_every: u32,
    /// The longest one catalog call may take before its outcome counts as unknown.
    pub commit_timeout: Duration,
    /// Delete this subtask's data files that no snapshot references at recovery.
    pub cleanup_on_recover: bool,
    /// Expire snapshots inside every commit by the table's standard retention properties, and delete the
    /// manifest lists of the snapshots a commit expired (`retire`).
    pub expire_snapshots: bool,
    /// Apply the rows by these key columns (the upsert mode): each checkpoint's last change per key is written
    /// as one row, with an equality delete of the key, in one snapshot (a row delta); a change stream's deletes
    /// delete their key. Empty: every row is appended (a change stream as a changelog).
    pub upsert_key: Vec<String>,
    /// How the upsert mode deletes a key's previous row: by position (the default) or by an equality delete.
    pub upsert_deletes: UpsertDeletes,
    /// Subtask 0's recovery deletes the files under the table's `data/` and `metadata/` that nothing references
    /// and that were last modified longer ago than this ([`crate::sweep_orphans`]); `None`: no sweep.
    pub sweep_orphans_after: Option<Duration>,
    /// Compaction inside the commits ([`Compact`](crate::Compact)): left at its default, an append table the
    /// sink created compacts with the default [`CompactPolicy`](crate::CompactPolicy), any other table not at all.
    pub compact: crate::compact_policy::Compact,
    /// The partition spec, sort order and properties of a table the sink creates (`create_table`).
    pub layout: crate::layout::TableLayout,
}

impl IcebergSinkConfig {
    /// How the upsert mode deletes (`None`: an append table, no `upsert_key`).
    pub fn upsert_mode(&self) -> Option<UpsertDeletes> {
        (!self.upsert_key.is_empty()).then_some(self.upsert_deletes)
    }
}

/// How opening a SQL catalog is retried: enough for the loser of two instances creating a fresh database's catalog
/// tables at once, short enough that an unreachable database is reported within seconds.
const SQL_OPEN_RETRY: RetryPolicy = RetryPolicy {
    max_attempts: 3,
    initial_backoff: Duration::from_millis(200),
    max_backoff: Duration::from_secs(1),
    max_total_backoff: Duration::from_secs(2),
};

/// The default target data file size: 128 MiB.
pub const DEFAULT_TARGET_FILE_SIZE: usize = 128 * 1024 * 1024;
/// The default longest catalog call.
pub const DEFAULT_COMMIT_TIMEOUT: Duration = Duration::from_secs(60);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_catalog_that_cannot_be_opened_for_now_is_retried_and_a_refused_setting_is_not() {
        let unreachable = setup_error(
            "cannot open SQL catalog".into(),
            iceberg::Error::new(
                iceberg::ErrorKind::Unexpected,
                "error communicating with database",
            ),
        );
        assert_eq!(unreachable.kind(), ErrorKind::Retryable);
        assert_eq!(
            connector_api::Report(&unreachable)
                .to_string()
                .matches("cannot open SQL catalog")
                .count(),
            1,
            "the message once: {}",
            connector_api::Report(&unreachable)
        );
        let refused = setup_error(
            "cannot open REST catalog".into(),
            iceberg::Error::new(iceberg::ErrorKind::DataInvalid, "warehouse is required"),
        );
        assert_eq!(refused.kind(), ErrorKind::Config);
    }

    #[test]
    fn catalogs_and_keys_never_show_a_secret() {
        let sql = CatalogConfig::Sql {
            uri: "postgres://u:hunter2@127.0.0.1/db".into(),
            warehouse: "file:///w".into(),
        };
        let rest = CatalogConfig::Rest {
            uri: "https://u:hunter2@catalog.example/api?token=hunter2".into(),
            warehouse: None,
            credential_env: None,
            props: HashMap::from([("credential".into(), "hunter2".into())]),
        };
        let s3: S3Settings = serde_json::from_value(serde_json::json!({
            "access_key_id": "AKIA", "secret_access_key": "hunter2"
        }))
        .unwrap();
        let shown = format!("{sql:?} {rest:?} {s3:?}");
        assert!(
            !shown.contains("hunter2") && shown.contains("AKIA"),
            "{shown}"
        );
        let half: S3Settings =
            serde_json::from_value(serde_json::json!({"access_key_id": "AKIA"})).unwrap();
        let err = half.file_io_props().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config);
        assert!(err.to_string().contains("secret_access_key"), "{err}");
    }
}
