//! What a JDBC sink instance is configured with.

use std::time::Duration;

use arrow_schema::SchemaRef;
use connector_api::{Error, ErrorKind, Evolution, Phase, Result, SinkId, SinkScope, SubtaskId};
use connector_common::config::redact_url;
use serde::Deserialize;

/// Which database a connection URL points at, from its scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// `postgres://` or `postgresql://`.
    Postgres,
    /// `mysql://` or `mariadb://` (MariaDB 10.5 or newer for XA mode).
    MySql,
}

impl Dialect {
    /// The dialect of `url`.
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) for any other scheme.
    pub fn of_url(url: &str) -> Result<Self> {
        let scheme = url.split_once("://").map(|(s, _)| s).unwrap_or("");
        match scheme {
            "postgres" | "postgresql" => Ok(Dialect::Postgres),
            "mysql" | "mariadb" => Ok(Dialect::MySql),
            _ => Err(config_error(
                "the url must start with postgres://, postgresql://, mysql:// or mariadb://",
            )),
        }
    }

    /// Checks that `table` (`name` or `schema.name`) names the table as written: PostgreSQL cuts identifiers
    /// longer than 63 bytes with only a notice (two long names would be one table), MariaDB refuses names over 64
    /// characters.
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) naming the part that is empty or too long, and the limit.
    pub fn check_table(self, table: &str) -> Result<()> {
        for part in table.split('.') {
            let (fits, limit) = match self {
                Dialect::Postgres => (part.len() <= 63, "63 bytes in PostgreSQL"),
                Dialect::MySql => (part.chars().count() <= 64, "64 characters in MariaDB"),
            };
            if part.is_empty() || !fits {
                return Err(config_error(format!(
                    "table {table:?}: {part:?} is not a name the database keeps as written (empty, or longer than \
                     {limit}, which would cut it and could make two tables one); use a shorter name"
                )));
            }
        }
        Ok(())
    }
}

/// How rows reach the table, and so what the sink's exactly-once rests on.
///
/// | mode | transaction per checkpoint | visible | exactly once because |
/// |---|---|---|---|
/// | `xa` | prepared (`PREPARE TRANSACTION` / `XA PREPARE`) at pre-commit, committed once the checkpoint record is durable | at commit | the commit decision is the checkpoint record; recovery commits or rolls back what is prepared |
/// | `xa_upsert` | prepared, as `xa` | at commit | as `xa`; rows are upserted and deleted by key inside the prepared transaction |
/// | `upsert` | ordinary, committed at pre-commit | at pre-commit | replayed rows overwrite themselves (last write per key wins) |
/// | `append` with `dedup` | ordinary, committed at pre-commit | at pre-commit | a dedup table of message ids, written in the same transaction, drops replayed rows |
///
/// The upsert and append modes are *effectively* exactly-once: after a crash before the checkpoint record was
/// durable, readers may already see rows of that checkpoint; the replay writes them again with the same effect.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum WriteMode {
    /// Prepared (XA) transactions; rows are appended (binary COPY on PostgreSQL, multi-row INSERT on MariaDB).
    Xa,
    /// `INSERT .. ON CONFLICT (key) DO UPDATE` / `ON DUPLICATE KEY UPDATE` in an ordinary transaction;
    /// tombstones delete their key's row (the key decoding is in the crate docs, "Tombstones").
    Upsert {
        /// The key columns (a primary key or unique index on the table).
        key: Vec<String>,
    },
    /// Prepared (XA) transactions, as `xa`, but rows are written by key as in `upsert` (`MERGE` / `ON
    /// DUPLICATE KEY UPDATE`) and tombstones and change rows with the operation `d` delete their key, all inside
    /// the prepared transaction: a change stream applied exactly once, visible only at commit.
    XaUpsert {
        /// The key columns (a primary key or unique index on the table).
        key: Vec<String>,
    },
    /// Appends, dropping rows whose message id is already in the dedup table.
    Append {
        /// The idempotent-consumer table.
        dedup: DedupConfig,
    },
}

impl WriteMode {
    /// Whether each checkpoint is a prepared transaction, committed once the checkpoint record is durable
    /// (`xa`, `xa_upsert`); the other modes commit at pre-commit.
    pub fn prepares(&self) -> bool {
        matches!(self, Self::Xa | Self::XaUpsert { .. })
    }

    /// The key rows are written and deleted by (`upsert`, `xa_upsert`); `None` in the appending modes.
    pub fn key(&self) -> Option<&[String]> {
        match self {
            Self::Upsert { key } | Self::XaUpsert { key } => Some(key),
            Self::Xa | Self::Append { .. } => None,
        }
    }
}

/// The dedup table of the append mode.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct DedupConfig {
    /// The column holding each row's message id (unique per source record).
    pub message_id: String,
    /// The table of seen ids (default `<table>_ratchet_dedup`).
    #[serde(default)]
    pub table: Option<String>,
    /// How long a seen id is remembered; a replay of records older than this would be written again.
    #[serde(with = "humantime_serde", default = "default_retention")]
    pub retention: Duration,
}

impl DedupConfig {
    /// The table of seen ids of a sink writing `table`: as configured, or `<table>_ratchet_dedup`.
    pub(crate) fn table_for(&self, table: &str) -> String {
        self.table
            .clone()
            .unwrap_or_else(|| format!("{table}_ratchet_dedup"))
    }
}

fn default_retention() -> Duration {
    Duration::from_secs(7 * 24 * 3600)
}

/// A JDBC sink instance: where it writes and how.
#[derive(Debug, Clone)]
pub struct JdbcSinkConfig {
    /// The sink's id: scopes its transaction ids, markers and owner row.
    pub sink: SinkId,
    /// Scopes the sink's transaction ids, owner rows and markers in the database ([`SinkScope`]): jobs and sinks
    /// writing into one database need different scopes.
    pub scope: SinkScope,
    /// The subtask this instance serves.
    pub subtask: SubtaskId,
    /// The schema of the batches it is given.
    pub schema: SchemaRef,
    /// The connection settings.
    pub connection: ConnectionConfig,
    /// The target table (`name` or `schema.name`).
    pub table: String,
    /// How rows are written.
    pub mode: WriteMode,
    /// Create the table from the Arrow schema when it does not exist.
    pub create_table: bool,
    /// Add the schema's columns the table lacks (at start, and when the batches' schema gains columns).
    pub evolution: Evolution,
    /// The longest any statement waits for a row lock: recovery's epoch raise (then it resolves prepared
    /// transactions again), a checkpoint's fencing update or a write (then the checkpoint is aborted and replayed).
    pub lock_timeout: Duration,
}

/// Where the database is and how to log in.
#[derive(Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ConnectionConfig {
    /// `postgres://user@host:port/db?sslmode=verify-full&sslrootcert=ca.pem` or `mysql://user@host:port/db`.
    /// A password may be in the URL, but prefer `password_env`.
    pub url: String,
    /// The environment variable holding the password (PostgreSQL also reads `PGPASSWORD` when neither is given).
    #[serde(default)]
    pub password_env: Option<String>,
}

impl std::fmt::Debug for ConnectionConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectionConfig")
            .field("url", &redact_url(&self.url))
            .field("password_env", &self.password_env)
            .finish()
    }
}

impl ConnectionConfig {
    /// A connection to `url`, password from the URL (or `PGPASSWORD`).
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            password_env: None,
        }
    }

    /// The password from `password_env`, when one is named.
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) naming the variable when it is not set.
    #[allow(clippy::disallowed_methods)] // `password_env` names the variable to read
    pub fn password(&self) -> Result<Option<String>> {
        match &self.password_env {
            None => Ok(None),
            Some(name) => std::env::var(name).map(Some).map_err(|_| {
                config_error(format!(
                    "password_env names {name}, which is not set: export it before starting the job"
                ))
            }),
        }
    }
}

pub(crate) fn config_error(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::Config, Phase::Setup, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_urls_never_show_passwords() {
        let mode: WriteMode = serde_json::from_value(serde_json::json!({
            "kind": "append", "dedup": {"message_id": "id", "retention": "2days"}
        }))
        .unwrap();
        assert_eq!(
            mode,
            WriteMode::Append {
                dedup: DedupConfig {
                    message_id: "id".into(),
                    table: None,
                    retention: Duration::from_secs(2 * 86400)
                }
            }
        );
        let err = serde_json::from_value::<WriteMode>(
            serde_json::json!({"kind": "upsert", "keys": ["id"]}),
        )
        .unwrap_err();
        assert!(err.to_string().contains("keys"), "{err}");
        let shown = format!(
            "{:?}",
            ConnectionConfig::new("mysql://ratchet:s3cret@127.0.0.1:3306/db")
        );
        assert!(
            !shown.contains("s3cret") && shown.contains("***"),
            "{shown}"
        );
        assert_eq!(Dialect::of_url("mariadb://h/db").unwrap(), Dialect::MySql);
        assert!(Dialect::of_url("jdbc:postgresql://h/db").is_err());
        let long = "t".repeat(64);
        for dialect in [Dialect::Postgres, Dialect::MySql] {
            dialect.check_table("shop.orders").unwrap();
            assert!(dialect.check_table("shop..orders").is_err());
        }
        let err = Dialect::Postgres
            .check_table(&long)
            .unwrap_err()
            .to_string();
        assert!(err.contains("longer than 63 bytes in PostgreSQL"), "{err}");
        Dialect::MySql.check_table(&long).unwrap();
        assert!(Dialect::MySql.check_table(&format!("{long}t")).is_err());
    }
}
