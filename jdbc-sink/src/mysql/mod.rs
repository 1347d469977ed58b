//! MariaDB / MySQL: `XA START` .. `XA PREPARE` / `XA COMMIT`, multi-row statements, `ON DUPLICATE KEY UPDATE`.

mod coordinator;
mod session;
pub(crate) mod target;

use connector_api::{Error, ErrorKind, Phase, Result};
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, OptsBuilder};

pub(crate) use coordinator::MySqlCoordinator;
pub(crate) use session::{MySqlSession, column_changes, schema_and_name, table_columns};

use crate::Xid;
use crate::config::{ConnectionConfig, config_error};

/// `XA PREPARE`d transactions must survive a disconnect and a server restart: MariaDB does so from 10.5 on.
const MIN_MARIADB_FOR_XA: (u32, u32) = (10, 5);
/// No such XA transaction (`XAER_NOTA`).
pub(crate) const ER_XAER_NOTA: u16 = 1397;
/// Lock wait timeout exceeded.
pub(crate) const ER_LOCK_WAIT_TIMEOUT: u16 = 1205;

/// Connection options for `connection`: the password from `password_env` when it names one, and affected-row
/// counts that count matched rows (the owner check must see its row even when the checkpoint is unchanged).
pub(crate) fn options(connection: &ConnectionConfig) -> Result<Opts> {
    let url = connection.url.replacen("mariadb://", "mysql://", 1);
    let opts = Opts::from_url(&url)
        .map_err(|e| config_error("the MySQL/MariaDB url is malformed").with_source(e))?;
    let mut builder = OptsBuilder::from_opts(opts)
        .client_found_rows(true)
        .prefer_socket(false);
    if let Some(password) = connection.password()? {
        builder = builder.pass(Some(password));
    }
    Ok(builder.into())
}

/// Maps a MySQL client error to the driver's kind: I/O and connection trouble, deadlocks and lock waits are
/// retryable, data the table refuses is a bad record, the rest is fatal.
pub(crate) fn classify(e: &mysql_async::Error) -> ErrorKind {
    match e {
        mysql_async::Error::Io(_) | mysql_async::Error::Driver(_) => ErrorKind::Retryable,
        mysql_async::Error::Server(server) => match server.code {
            // deadlock, lock wait timeout, too many connections, server shutdown, lost connection
            1213 | ER_LOCK_WAIT_TIMEOUT | 1040 | 1053 | 2006 | 2013 => ErrorKind::Retryable,
            // A character the column's character set cannot hold; data truncated (strict mode): the row's
            // values, not the system (their SQLSTATE is HY000 / 01000).
            1366 | 1265 => ErrorKind::BadRecord,
            _ if server.state.starts_with("22") || server.state.starts_with("23") => {
                ErrorKind::BadRecord
            }
            _ => ErrorKind::Fatal,
        },
        _ => ErrorKind::Fatal,
    }
}

/// An error of `phase` about `what`, with `xid`'s coordinates: a server error's message and code in the message (the
/// driver's error not attached: its text would repeat them), any other error (the connection broke) attached as
/// the source, not repeated.
pub(crate) fn my_error(
    phase: Phase,
    xid: Option<&Xid>,
    what: &str,
    e: mysql_async::Error,
) -> Error {
    let kind = classify(&e);
    let error = match &e {
        mysql_async::Error::Server(server) => Error::new(
            kind,
            phase,
            format!("{what}: {} (error {})", server.message, server.code),
        ),
        _ => Error::new(kind, phase, what).with_source(e),
    };
    Xid::locate(error, xid)
}

/// The server error code of `e`, if it is one.
pub(crate) fn server_code(e: &mysql_async::Error) -> Option<u16> {
    match e {
        mysql_async::Error::Server(server) => Some(server.code),
        _ => None,
    }
}

/// Opens a connection, in READ COMMITTED: InnoDB then takes no gap locks for the sink's range statements (the
/// marker cleanup), so a prepared transaction of one subtask, holding its rows until commit, never blocks another
/// subtask's (or sink's) markers and owner row. Values are exchanged as utf8mb4 (any character), TIMESTAMP columns
/// read in UTC (`time_zone = '+00:00'`), and strict mode is on (`STRICT_ALL_TABLES`, added to the server's
/// modes), so a value a column cannot hold is refused instead of cut or zeroed.
pub(crate) async fn connect(opts: &Opts, phase: Phase, what: &str) -> Result<Conn> {
    let mut conn = Conn::new(opts.clone()).await.map_err(|e| {
        let kind = match classify(&e) {
            ErrorKind::BadRecord => ErrorKind::Fatal,
            ErrorKind::Fatal if server_code(&e) == Some(1045) => ErrorKind::Config,
            kind => kind,
        };
        Error::new(
            kind,
            phase,
            format!(
                "cannot open {what} at {}:{}: {e}",
                opts.ip_or_hostname(),
                opts.tcp_port()
            ),
        )
        .with_source(e)
    })?;
    conn.query_drop("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        .await
        .map_err(|e| my_error(phase, None, "cannot set READ COMMITTED", e))?;
    conn.query_drop(
        "SET NAMES utf8mb4, time_zone = '+00:00', \
         sql_mode = CONCAT_WS(',', NULLIF(@@SESSION.sql_mode, ''), 'STRICT_ALL_TABLES')",
    )
    .await
    .map_err(|e| {
        my_error(
            phase,
            None,
            "cannot set the session's character set, time zone and strict mode",
            e,
        )
    })?;
    Ok(conn)
}

/// Parses `10.11.19-MariaDB-..` and checks XA survives disconnects there.
pub(crate) fn check_xa_version(version: &str) -> Result<()> {
    let mut parts = version.split(|c: char| !c.is_ascii_digit());
    let major: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let minor: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    if version.contains("MariaDB") && (major, minor) < MIN_MARIADB_FOR_XA {
        return Err(config_error(format!(
            "MariaDB {version} rolls back XA PREPAREd transactions when their connection closes, so the xa mode \
             cannot be exactly-once there; upgrade to MariaDB 10.5 or newer, or use mode = upsert"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn old_mariadb_is_refused_for_xa() {
        assert!(super::check_xa_version("10.4.32-MariaDB").is_err());
        assert!(super::check_xa_version("10.11.19-MariaDB-0+deb12u1").is_ok());
        assert!(super::check_xa_version("8.0.36").is_ok());
    }
}
