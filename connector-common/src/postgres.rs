//! Connecting to PostgreSQL the one way every Ratchet component does (the checkpoint store, the JDBC sink, the
//! worker's leases): a libpq URL with libpq's TLS parameters, and the password from the URL or the environment.
//!
//! | URL parameter | meaning |
//! |---|---|
//! | `sslmode` | `disable`, `prefer` (the default: TLS when the server offers it), `require`, `verify-ca`, `verify-full` |
//! | `sslrootcert` | PEM file of the CA to trust; with `prefer`/`require` it makes the server's chain checked too (as libpq does); `verify-*` without it use the system trust store |
//! | `sslcert`, `sslkey` | client certificate and unencrypted key (PEM), for servers that ask for one |
//!
//! The password comes from the URL or, when the URL has none, from `PGPASSWORD` (as with libpq), so that it can
//! stay out of job files.
//!
//! # A silent server is noticed
//! libpq's defaults wait forever for a server that stops answering without closing the connection (no connect
//! timeout, the kernel's 2 h keepalive). Unless the URL sets them, every connection gets
//! [`CONNECT_TIMEOUT`], TCP keepalives after [`KEEPALIVE_IDLE`] (probes every [`KEEPALIVE_INTERVAL`], given up
//! after [`KEEPALIVE_RETRIES`]) and a [`TCP_USER_TIMEOUT`] for unacknowledged data: a dead route or a hung host
//! ends the connection with an error within about half a minute. Server-side limits for sessions that hold locks
//! (`idle_in_transaction_session_timeout`) are set per use with [`PgConnectOptions::with_session_limits`].
//!
//! The password is never logged: [`tokio_postgres::Config`]'s `Debug` redacts it and errors carry
//! no URL.

use std::path::PathBuf;
use std::time::Duration;

use tokio_postgres::config::SslMode;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::tls::{ServerCheck, TlsSettings};
use crate::{Error, Result};

/// The environment variable the password is read from when the URL has none.
pub const PASSWORD_VARIABLE: &str = "PGPASSWORD";

/// How long opening a connection may take (TCP, TLS and login), unless the URL sets `connect_timeout`.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Idle time before the first TCP keepalive probe, unless the URL sets `keepalives_idle`.
pub const KEEPALIVE_IDLE: Duration = Duration::from_secs(10);
/// Time between unanswered TCP keepalive probes.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
/// Unanswered keepalive probes before the connection is given up.
pub const KEEPALIVE_RETRIES: u32 = 3;
/// How long sent data may stay unacknowledged before the connection is given up, unless the URL sets
/// `tcp_user_timeout`.
pub const TCP_USER_TIMEOUT: Duration = Duration::from_secs(30);

/// tokio-postgres's default keepalive idle time: a URL that leaves it there did not choose one.
const LIBPQ_KEEPALIVE_IDLE: Duration = Duration::from_secs(2 * 60 * 60);

/// How to reach one PostgreSQL database: connection settings and the TLS connector for them.
#[derive(Clone)]
pub struct PgConnectOptions {
    config: tokio_postgres::Config,
    tls: MakeRustlsConnect,
}

impl std::fmt::Debug for PgConnectOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // tokio_postgres::Config's Debug redacts the password.
        f.debug_struct("PgConnectOptions")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

fn config_error(message: impl Into<String>) -> Error {
    Error::config(message)
}

/// The TLS parameters libpq takes that tokio-postgres does not parse, taken out of the URL.
#[derive(Default)]
struct LibpqTls {
    mode: Option<String>,
    root_cert: Option<PathBuf>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
}

impl LibpqTls {
    /// Takes `sslmode`, `sslrootcert`, `sslcert` and `sslkey` out of `url` (URL or key-value form) and returns
    /// the rest.
    fn take(url: &str) -> Result<(Self, String)> {
        let mut tls = Self::default();
        let mut take = |key: &str, value: String| match key {
            "sslmode" => {
                tls.mode = Some(value);
                true
            }
            "sslrootcert" => {
                tls.root_cert = Some(value.into());
                true
            }
            "sslcert" => {
                tls.cert = Some(value.into());
                true
            }
            "sslkey" => {
                tls.key = Some(value.into());
                true
            }
            _ => false,
        };
        let rest = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            let mut parsed = url::Url::parse(url)
                .map_err(|e| config_error(format!("the PostgreSQL URL is malformed: {e}")))?;
            let kept: Vec<(String, String)> = parsed
                .query_pairs()
                .filter(|(k, v)| !take(k, v.to_string()))
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect();
            if kept.is_empty() {
                parsed.set_query(None);
            } else {
                // Form encoding writes a space as `+`, which libpq and tokio-postgres read as a `+`
                // (`options=-c%20work_mem%3D4MB` must stay `-c work_mem=4MB`); a `+` itself is `%2B` there.
                let query = url::form_urlencoded::Serializer::new(String::new())
                    .extend_pairs(kept)
                    .finish()
                    .replace('+', "%20");
                parsed.set_query(Some(&query));
            }
            parsed.to_string()
        } else {
            url.split_whitespace()
                .filter(|pair| match pair.split_once('=') {
                    Some((k, v)) => !take(k.trim(), v.trim_matches('\'').to_string()),
                    None => true,
                })
                .collect::<Vec<_>>()
                .join(" ")
        };
        Ok((tls, rest))
    }

    /// tokio-postgres's mode and how much of the server certificate is checked.
    fn mode(&self) -> Result<(SslMode, ServerCheck)> {
        let checked_if_rooted = if self.root_cert.is_some() {
            ServerCheck::ChainOnly
        } else {
            ServerCheck::Off
        };
        Ok(match self.mode.as_deref().unwrap_or("prefer") {
            "disable" => (SslMode::Disable, ServerCheck::Off),
            "allow" | "prefer" => (SslMode::Prefer, checked_if_rooted),
            "require" => (SslMode::Require, checked_if_rooted),
            "verify-ca" => (SslMode::Require, ServerCheck::ChainOnly),
            "verify-full" => (SslMode::Require, ServerCheck::Full),
            other => {
                return Err(config_error(format!(
                    "sslmode={other} is not one of disable, allow, prefer, require, verify-ca, verify-full"
                )));
            }
        })
    }
}

impl PgConnectOptions {
    /// Parses a libpq URL (`postgres://user@host:port/db?sslmode=verify-full&sslrootcert=ca.pem`) or key-value
    /// string; a missing password is read from `PGPASSWORD`.
    ///
    /// # Errors
    /// [`Config`](crate::ErrorKind::Config) for a malformed URL, an unknown `sslmode`, `sslcert` without `sslkey`, or an
    /// unreadable CA, certificate or key file (named); the URL itself is never part of the message.
    #[allow(clippy::disallowed_methods)] // the URL's settings read PGPASSWORD, as libpq does
    pub fn parse(url: &str) -> Result<Self> {
        Self::parse_with_env(url, |name| std::env::var(name).ok())
    }

    /// [`parse`](Self::parse), reading environment variables through `env`.
    fn parse_with_env(url: &str, env: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let (libpq, rest) = LibpqTls::take(url)?;
        let mut config: tokio_postgres::Config = rest
            .parse()
            .map_err(|e| config_error("the PostgreSQL URL is malformed").with_source(e))?;
        let (mode, server_check) = libpq.mode()?;
        config.ssl_mode(mode);
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        if config.get_keepalives_idle() == LIBPQ_KEEPALIVE_IDLE {
            config
                .keepalives(true)
                .keepalives_idle(KEEPALIVE_IDLE)
                .keepalives_interval(KEEPALIVE_INTERVAL)
                .keepalives_retries(KEEPALIVE_RETRIES);
        }
        if config.get_tcp_user_timeout().is_none() {
            config.tcp_user_timeout(TCP_USER_TIMEOUT);
        }
        if config.get_password().is_none()
            && let Some(password) = env(PASSWORD_VARIABLE)
        {
            config.password(password);
        }
        let client_identity = match (libpq.cert, libpq.key) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            _ => {
                return Err(config_error(
                    "sslcert and sslkey go together: give both, or neither",
                ));
            }
        };
        let settings = TlsSettings {
            ca_file: libpq.root_cert,
            client_identity,
            server_check,
        };
        let tls = if mode == SslMode::Disable {
            // Never used: still a valid connector, without reading any file.
            MakeRustlsConnect::new(
                TlsSettings {
                    server_check: ServerCheck::Off,
                    ..TlsSettings::default()
                }
                .client_config()?,
            )
        } else {
            MakeRustlsConnect::new(settings.client_config()?)
        };
        Ok(Self { config, tls })
    }

    /// The same options with `password` (for a password kept out of the URL, e.g. read from an environment
    /// variable the job names).
    pub fn with_password(mut self, password: &str) -> Self {
        self.config.password(password);
        self
    }

    /// The same options for sessions that may hold locks: the server ends a session that stays idle inside a
    /// transaction for longer than `idle_in_transaction` (PostgreSQL's `idle_in_transaction_session_timeout`), so
    /// a client that vanished without closing its connection (a lost route, a powered-off machine, a proxy that
    /// keeps the server side open) releases its locks within that time, not after the server's TCP keepalive
    /// (2 h by default). `application_name` labels the session in `pg_stat_activity`, which is how a waiting
    /// claim names who holds the lock.
    pub fn with_session_limits(
        mut self,
        idle_in_transaction: Duration,
        application_name: &str,
    ) -> Self {
        let setting = format!(
            "-c idle_in_transaction_session_timeout={}",
            idle_in_transaction.as_millis().max(1)
        );
        let options = match self.config.get_options() {
            Some(existing) if !existing.is_empty() => format!("{existing} {setting}"),
            _ => setting,
        };
        self.config.options(options);
        // PostgreSQL truncates it to 63 bytes.
        self.config.application_name(application_name);
        self
    }

    /// The connection settings (host, user, database, `sslmode`, ...).
    pub fn config(&self) -> &tokio_postgres::Config {
        &self.config
    }

    /// The TLS connector for [`tokio_postgres::Config::connect`] and connection pools.
    pub fn tls(&self) -> MakeRustlsConnect {
        self.tls.clone()
    }

    /// Opens one connection and drives it on the runtime; the client fails once the connection ends.
    ///
    /// # Errors
    /// [`Unavailable`](crate::ErrorKind::Unavailable) when the server cannot be reached, TLS fails or it
    /// refuses the login (with the driver's error attached); `what` names the connection in the message.
    pub async fn connect(&self, what: &str) -> Result<tokio_postgres::Client> {
        let (client, connection) = self
            .config
            .connect(self.tls())
            .await
            .map_err(|e| Error::unavailable(format!("cannot open {what}")).with_source(e))?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "a PostgreSQL connection ended");
            }
        });
        Ok(client)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libpq_tls_parameters_are_taken_out_of_the_url() {
        let (tls, rest) = LibpqTls::take(
            "postgres://u:p@127.0.0.1:5432/db?sslmode=verify-full&sslrootcert=/ca.pem&application_name=x",
        )
        .unwrap();
        assert_eq!(tls.mode.as_deref(), Some("verify-full"));
        assert_eq!(tls.root_cert, Some(PathBuf::from("/ca.pem")));
        assert_eq!(rest, "postgres://u:p@127.0.0.1:5432/db?application_name=x");
        let (tls, rest) =
            LibpqTls::take("host=127.0.0.1 sslmode=require sslrootcert=/ca.pem user=u").unwrap();
        assert_eq!(tls.mode.as_deref(), Some("require"));
        assert_eq!(rest, "host=127.0.0.1 user=u");
    }

    #[test]
    fn modes_map_to_checks() {
        let mode = |m: &str, root: bool| {
            LibpqTls {
                mode: Some(m.into()),
                root_cert: root.then(|| PathBuf::from("/ca.pem")),
                ..LibpqTls::default()
            }
            .mode()
            .unwrap()
        };
        assert_eq!(mode("require", false), (SslMode::Require, ServerCheck::Off));
        assert_eq!(
            mode("require", true),
            (SslMode::Require, ServerCheck::ChainOnly)
        );
        assert_eq!(
            mode("verify-ca", false),
            (SslMode::Require, ServerCheck::ChainOnly)
        );
        assert_eq!(
            mode("verify-full", true),
            (SslMode::Require, ServerCheck::Full)
        );
        let err = LibpqTls {
            mode: Some("always".into()),
            ..LibpqTls::default()
        }
        .mode()
        .unwrap_err();
        assert!(err.to_string().contains("sslmode=always"), "{err}");
    }

    #[test]
    fn the_password_comes_from_pgpassword_when_the_url_has_none() {
        let env = |name: &str| (name == PASSWORD_VARIABLE).then(|| "from-env".to_string());
        let options = PgConnectOptions::parse_with_env("postgres://u@127.0.0.1/db", env).unwrap();
        assert_eq!(options.config().get_password(), Some(&b"from-env"[..]));
        let options =
            PgConnectOptions::parse_with_env("postgres://u:in-url@127.0.0.1/db", env).unwrap();
        assert_eq!(options.config().get_password(), Some(&b"in-url"[..]));
        assert!(!format!("{options:?}").contains("in-url"), "{options:?}");
    }

    #[test]
    fn a_silent_server_is_given_up_unless_the_url_chooses_otherwise() {
        let options = PgConnectOptions::parse("postgres://u@127.0.0.1/db").unwrap();
        let config = options.config();
        assert_eq!(config.get_connect_timeout(), Some(&CONNECT_TIMEOUT));
        assert_eq!(config.get_keepalives_idle(), KEEPALIVE_IDLE);
        assert_eq!(config.get_tcp_user_timeout(), Some(&TCP_USER_TIMEOUT));
        let options = PgConnectOptions::parse(
            "postgres://u@127.0.0.1/db?connect_timeout=3&keepalives_idle=60&tcp_user_timeout=7",
        )
        .unwrap();
        let config = options.config();
        assert_eq!(config.get_connect_timeout(), Some(&Duration::from_secs(3)));
        assert_eq!(config.get_keepalives_idle(), Duration::from_secs(60));
        assert_eq!(config.get_tcp_user_timeout(), Some(&Duration::from_secs(7)));
        let limited =
            PgConnectOptions::parse("postgres://u@127.0.0.1/db?options=-c%20work_mem%3D4MB")
                .unwrap()
                .with_session_limits(Duration::from_secs(45), "ratchet guard");
        assert_eq!(
            limited.config().get_options(),
            Some("-c work_mem=4MB -c idle_in_transaction_session_timeout=45000")
        );
        assert_eq!(
            limited.config().get_application_name(),
            Some("ratchet guard")
        );
    }

    #[test]
    fn a_malformed_url_error_does_not_show_the_password() {
        let err = PgConnectOptions::parse("postgres://u:hunter2-secret@127.0.0.1:notaport/db")
            .unwrap_err();
        assert!(!err.to_string().contains("hunter2"), "{err}");
        assert!(!format!("{err:?}").contains("hunter2"), "{err:?}");
    }
}
