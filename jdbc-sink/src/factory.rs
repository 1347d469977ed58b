//! The JDBC sink in a job file: `[[sinks]]` entries with `type = "jdbc"`.

use std::time::Duration;

use async_trait::async_trait;
use connector_api::{
    DeliveryGuarantee, DynSink, Result, SinkBuilder, SinkCheck, SinkContext, SinkId, SinkScope,
};
use serde::Deserialize;

use crate::JdbcSink;
use crate::config::{ConnectionConfig, Dialect, JdbcSinkConfig, WriteMode};

/// The settings of a JDBC sink in a job file.
///
/// | key | meaning | default |
/// |---|---|---|
/// | `url` | `postgres://user@host:port/db?sslmode=..` or `mysql://user@host:port/db` (no password here, ideally) | required |
/// | `password_env` | the environment variable holding the password | none (PostgreSQL: `PGPASSWORD`) |
/// | `table` | the target table, `name` or `schema.name` | required |
/// | `mode` | `{ kind = "xa" }`, `{ kind = "xa_upsert", key = ["id"] }` (prepared transactions, rows upserted and deleted by key), `{ kind = "upsert", key = ["id"] }` (tombstones and change rows with `__op = "d"` delete by key; see the crate docs, "Tombstones" and "Change streams") or `{ kind = "append", dedup = { message_id = "id", retention = "7days" } }` | xa |
/// | `create_table` | create the table from the batches' schema when missing | false |
/// | `scope` | scopes transaction ids, owner and marker rows in the database (unique per job and sink there) | `<job>~<sink id>` (jobs first run before job scoping, and sinks built without a job: the sink id) |
/// | `lock_timeout` | the longest any statement of the sink waits for a row lock (recovery then resolves prepared transactions again; a checkpoint is aborted and replayed) | 5s |
///
/// ```toml
/// [[sinks]]
/// type = "jdbc"
/// id = "orders-db"
/// delivery = "exactly-once"
/// url = "postgres://ratchet@127.0.0.1:15432/ratchet?sslmode=verify-full&sslrootcert=/etc/ratchet/ca.pem"
/// password_env = "ORDERS_DB_PASSWORD"
/// table = "orders"
/// mode = { kind = "upsert", key = ["id"] }
/// ```
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JdbcSinkSettings {
    /// The connection URL.
    pub url: String,
    /// The environment variable holding the password.
    #[serde(default)]
    pub password_env: Option<String>,
    /// The target table.
    pub table: String,
    /// How rows are written.
    #[serde(default = "default_mode")]
    pub mode: WriteMode,
    /// Create the table when missing.
    #[serde(default)]
    pub create_table: bool,
    /// Scopes transaction ids and Ratchet's rows in the database.
    #[serde(default)]
    pub scope: Option<SinkId>,
    /// The longest wait for a row lock.
    #[serde(with = "humantime_serde", default = "default_lock_timeout")]
    pub lock_timeout: Duration,
}

fn default_mode() -> WriteMode {
    WriteMode::Xa
}

/// The default longest wait for a row lock.
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(5);

fn default_lock_timeout() -> Duration {
    DEFAULT_LOCK_TIMEOUT
}

/// Builds [`JdbcSink`]s from [`JdbcSinkSettings`].
///
/// At-least-once commits each checkpoint's transaction at pre-commit ([`GuaranteedSink`](connector_api::GuaranteedSink));
/// in xa mode that still prepares first, so it is not cheaper than exactly-once; upsert and append are already
/// committed at pre-commit and behave the same under every guarantee except that at-most-once never replays.
#[derive(Debug, Clone, Copy, Default)]
pub struct JdbcSinkFactory;

#[async_trait]
impl SinkBuilder for JdbcSinkFactory {
    const KIND: &'static str = "jdbc";
    type Settings = JdbcSinkSettings;

    fn key_columns(settings: &JdbcSinkSettings) -> Vec<String> {
        settings
            .mode
            .key()
            .map(<[String]>::to_vec)
            .unwrap_or_default()
    }

    async fn build_sink(
        &self,
        settings: JdbcSinkSettings,
        delivery: DeliveryGuarantee,
        context: SinkContext,
    ) -> Result<DynSink> {
        let config = config(settings, context)?;
        Ok(DynSink::new(JdbcSink::new(config).await?, delivery))
    }

    async fn check_sink(
        &self,
        settings: JdbcSinkSettings,
        _: DeliveryGuarantee,
        context: SinkContext,
    ) -> Result<SinkCheck> {
        crate::check::check(&config(settings, context)?).await
    }

    /// The batches' columns the table lacks (none before the first run creates it).
    async fn lacking_columns(
        &self,
        settings: JdbcSinkSettings,
        context: SinkContext,
    ) -> Result<Vec<String>> {
        crate::check::lacking_columns(&config(settings, context)?).await
    }
}

/// The sink's config from its settings and the job.
///
/// # Errors
/// [`Config`](connector_api::ErrorKind::Config) for a url of no known database, or a table name it would not
/// keep as written.
fn config(settings: JdbcSinkSettings, context: SinkContext) -> Result<JdbcSinkConfig> {
    Dialect::of_url(&settings.url)?.check_table(&settings.table)?;
    Ok(JdbcSinkConfig {
        scope: settings
            .scope
            .map_or_else(|| context.scope(), SinkScope::from),
        sink: context.sink,
        subtask: context.subtask,
        schema: context.schema,
        connection: ConnectionConfig {
            url: settings.url,
            password_env: settings.password_env,
        },
        table: settings.table,
        mode: settings.mode,
        create_table: settings.create_table,
        evolution: context.evolution,
        lock_timeout: settings.lock_timeout,
    })
}
