//! MariaDB keeps a prepared XA transaction attached to the session that prepared it until the server ends that
//! session (issue 20). Until then every other session's `XA COMMIT` / `XA ROLLBACK` fails "unknown XID" (the same
//! error as for a transaction that is gone), while `XA RECOVER` still lists it. The server may end a session long
//! after its client closed it; these tests make it do so deterministically and check that nothing is lost,
//! doubled or wrongly reported:
//!
//! - through a TCP proxy that swallows the client's `COM_QUIT` and keeps the server side of a closed connection
//!   open for 8 s, a driver job checkpoints and commits at once: the writer ends its own session after
//!   `XA PREPARE` (`KILL CONNECTION`, which leaves the transaction prepared), so the commit finds it;
//! - a committer meeting a prepared transaction attached to a session the test holds waits for the session to
//!   end and commits (released after 3 s), or fails retryable naming the transaction, still prepared (never
//!   released) - never "lost";
//! - a recovery meeting an undecided transaction attached to a held session (it holds the owner row) fails
//!   retryable naming it within its bounded wait, instead of waiting for the owner row 15 times; once the session
//!   ended, recovery rolls it back.
//!
//! Every check reads back with the independent verifier (pymysql). MariaDB only: PostgreSQL's prepared
//! transactions are not attached to a session.

use crate::common;

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{Db, cli, config, read, short_name};
use connector_api::{
    CheckpointId, Committer, Driver, DriverConfig, ErrorKind, LocalCheckpointStore, SinkId,
    SubtaskId, TwoPhaseCommit,
};
use jdbc_sink::{ConnectionConfig, JdbcCommittable, JdbcSink, WriteMode, Xid};
use mysql_async::prelude::Queryable;
use ratchet_conformance::{conformance_batch as batch, conformance_positions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

fn sink_id() -> SinkId {
    SinkId::new("detached").unwrap()
}

/// A fresh table and scope for one test.
fn names(what: &str) -> (String, String) {
    let unique = test_support::unique_name(what);
    (
        short_name("detach_", &[&unique]),
        short_name("d", &[&unique]),
    )
}

/// A TCP proxy in front of MariaDB that models "the client closed its session, the server has not noticed yet":
/// it drops the client's `COM_QUIT` (payload `0x01`, sequence 0) and keeps the server side of every connection
/// the client closed open for `hold`, then closes it (the server then ends the session).
struct HoldProxy {
    port: u16,
    quits: Arc<AtomicUsize>,
    accept: tokio::task::JoinHandle<()>,
}

impl HoldProxy {
    /// Listens on 127.0.0.1 (any port) and forwards to the test MariaDB.
    async fn start(hold: Duration) -> HoldProxy {
        let url = url::Url::parse(&Db::MariaDb.url()).expect("mysql url");
        let upstream = format!(
            "{}:{}",
            url.host_str().expect("host"),
            url.port().unwrap_or(3306)
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let quits = Arc::new(AtomicUsize::new(0));
        let counter = quits.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(relay(client, upstream.clone(), hold, counter.clone()));
            }
        });
        HoldProxy {
            port,
            quits,
            accept,
        }
    }

    /// The test MariaDB's URL, through the proxy.
    fn url(&self) -> String {
        let mut url = url::Url::parse(&Db::MariaDb.url()).expect("mysql url");
        url.set_host(Some("127.0.0.1")).unwrap();
        url.set_port(Some(self.port)).unwrap();
        url.to_string()
    }

    /// How many `COM_QUIT`s the proxy swallowed so far.
    fn quits(&self) -> usize {
        self.quits.load(Ordering::SeqCst)
    }
}

impl Drop for HoldProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// One proxied connection: server to client as is; client to server packet by packet without `COM_QUIT`; once
/// the client closed, the server side stays open for `hold`.
async fn relay(client: TcpStream, upstream: String, hold: Duration, quits: Arc<AtomicUsize>) {
    let Ok(server) = TcpStream::connect(&upstream).await else {
        return;
    };
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    tokio::spawn(async move {
        let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
    });
    let mut pending: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let n = match client_read.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        pending.extend_from_slice(&chunk[..n]);
        let mut out = Vec::new();
        while pending.len() >= 4 {
            let len = u32::from_le_bytes([pending[0], pending[1], pending[2], 0]) as usize;
            if pending.len() < 4 + len {
                break;
            }
            let packet: Vec<u8> = pending.drain(..4 + len).collect();
            if len == 1 && packet[3] == 0 && packet[4] == 0x01 {
                quits.fetch_add(1, Ordering::SeqCst);
            } else {
                out.extend_from_slice(&packet);
            }
        }
        if server_write.write_all(&out).await.is_err() {
            return;
        }
    }
    // The client is gone; the server learns it only after `hold`.
    tokio::time::sleep(hold).await;
    drop(server_write);
}

/// The sink's xid of `checkpoint` (subtask 0) under `scope`.
fn xid_of(scope: &str, checkpoint: u64) -> String {
    Xid {
        scope: SinkId::new(scope).unwrap().into(),
        subtask: SubtaskId(0),
        checkpoint: CheckpointId(checkpoint),
    }
    .to_string()
}

/// Prepares the sink's transaction of `checkpoint` in a session of the test's own, as the sink's writer does:
/// the rows `ids`, the owner check at `epoch` when given (the owner row stays locked by the prepared transaction),
/// the commit marker; then `XA END`, `XA PREPARE`. Returns the session, still connected (so the transaction stays
/// attached to it), and the xid.
async fn prepare_in_held_session(
    table: &str,
    scope: &str,
    checkpoint: u64,
    ids: Range<i64>,
    epoch: Option<u64>,
) -> (mysql_async::Conn, String) {
    let xid = xid_of(scope, checkpoint);
    let opts = mysql_async::Opts::from_url(&Db::MariaDb.url()).unwrap();
    let mut conn = mysql_async::Conn::new(opts).await.unwrap();
    conn.query_drop(format!("XA START '{xid}'")).await.unwrap();
    let rows: Vec<String> = ids.map(|id| format!("({id}, 'record-{id}')")).collect();
    conn.query_drop(format!(
        "INSERT INTO {table} (id, payload) VALUES {}",
        rows.join(", ")
    ))
    .await
    .unwrap();
    if let Some(epoch) = epoch {
        conn.exec_drop(
            "UPDATE ratchet_sink_owners SET checkpoint = ? WHERE sink = ? AND subtask = 0 AND epoch = ?",
            (checkpoint, scope, epoch),
        )
        .await
        .unwrap();
        assert_eq!(conn.affected_rows(), 1, "the owner check of {xid}");
    }
    conn.exec_drop(
        "INSERT INTO ratchet_xa_commits (sink, subtask, checkpoint) VALUES (?, 0, ?)",
        (scope, checkpoint),
    )
    .await
    .unwrap();
    conn.query_drop(format!("XA END '{xid}'")).await.unwrap();
    conn.query_drop(format!("XA PREPARE '{xid}'"))
        .await
        .unwrap();
    (conn, xid)
}

/// The ids the verifier reads, sorted, and the sink's prepared transactions.
fn read_sorted(table: &str, scope: &str) -> (Vec<i64>, Vec<String>) {
    let (mut ids, prepared) = read(Db::MariaDb, table, &[scope]);
    ids.sort_unstable();
    (ids, prepared)
}

/// End to end through the hold proxy: the session that prepared outlives the writer's close by 8 s, far longer
/// than any wait of the sink. The writer ends it itself (the transaction stays prepared), so the commit finds
/// the transaction at once and every record is there once. (Before: the commit met "unknown XID" and reported
/// the checkpoint's rows lost, Fatal, about 3 s after the prepare.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_after_a_close_the_server_has_not_noticed() {
    const HOLD: Duration = Duration::from_secs(8);
    let (table, scope) = names("held");
    let proxy = HoldProxy::start(HOLD).await;
    let mut sink_config = config(Db::MariaDb, &sink_id(), 0, &table, &scope, WriteMode::Xa);
    sink_config.connection = ConnectionConfig::new(proxy.url());
    let state = tempfile::tempdir().unwrap();
    let mut job = Driver::new(
        LocalCheckpointStore::open(state.path(), 3).unwrap(),
        DriverConfig::default(),
    );
    let sink = job
        .add_sink(JdbcSink::new(sink_config).await.unwrap())
        .unwrap();
    job.start().await.unwrap();

    job.write(sink, &batch(0..100)).await.unwrap();
    let started = Instant::now();
    job.checkpoint(conformance_positions(100)).await.unwrap();
    job.finish_commit().await.unwrap();
    let committed = started.elapsed();
    assert!(
        proxy.quits() >= 1,
        "the proxy should have kept the session that prepared on the server"
    );
    // Waiting for the proxy to let the session go would take HOLD: the writer ended it itself.
    assert!(
        committed < HOLD,
        "checkpoint and commit took {committed:?}, as if waiting for the held session"
    );

    job.write(sink, &batch(100..200)).await.unwrap();
    job.checkpoint(conformance_positions(200)).await.unwrap();
    job.close().await.unwrap();
    println!("checkpoint and commit through a session held {HOLD:?} after close: {committed:?}");

    let (ids, prepared) = read_sorted(&table, &scope);
    assert_eq!(
        ids,
        (0..200).collect::<Vec<_>>(),
        "rows after two checkpoints"
    );
    assert!(prepared.is_empty(), "prepared left: {prepared:?}");
}

/// The committer meets a decided transaction still attached to the session that prepared it: it waits for the
/// session to end (3 s) and commits, rows visible once. Never released: it fails retryable naming the
/// transaction, which stays prepared. (Before: Fatal "rows lost" after about 1.3 s, though still prepared.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committer_waits_for_the_session_that_prepared() {
    const RELEASE_AFTER: Duration = Duration::from_secs(3);
    let (table, scope) = names("attached");
    let sink = JdbcSink::new(config(
        Db::MariaDb,
        &sink_id(),
        0,
        &table,
        &scope,
        WriteMode::Xa,
    ))
    .await
    .unwrap();

    let (held, xid) = prepare_in_held_session(&table, &scope, 7, 0..50, None).await;
    let started = Instant::now();
    let release = tokio::spawn(async move {
        tokio::time::sleep(RELEASE_AFTER).await;
        held.disconnect().await.unwrap();
    });
    sink.committer()
        .commit(vec![JdbcCommittable {
            xid: xid.clone(),
            prepared: true,
        }])
        .await
        .unwrap();
    let waited = started.elapsed();
    release.await.unwrap();
    assert!(
        waited >= RELEASE_AFTER,
        "committed after {waited:?}, before the session that prepared was released"
    );
    println!("{xid}: committed {waited:?} after the commit started, once its session ended");
    let (ids, prepared) = read_sorted(&table, &scope);
    assert_eq!(ids, (0..50).collect::<Vec<_>>(), "rows of {xid}");
    assert!(prepared.is_empty(), "prepared left: {prepared:?}");

    // Never released: retryable, the transaction still prepared.
    let (mut held, xid) = prepare_in_held_session(&table, &scope, 8, 50..60, None).await;
    let started = Instant::now();
    let err = sink
        .committer()
        .commit(vec![JdbcCommittable {
            xid: xid.clone(),
            prepared: true,
        }])
        .await
        .unwrap_err();
    let waited = started.elapsed();
    assert_eq!(err.kind(), ErrorKind::Retryable, "{err}");
    assert!(err.to_string().contains(&xid), "{err}");
    assert!(
        waited < Duration::from_secs(30),
        "the commit should give up within its bounded wait: {waited:?}"
    );
    println!("{xid}: never released, the commit failed after {waited:?}: {err}");
    let (ids, prepared) = read_sorted(&table, &scope);
    assert_eq!(
        prepared,
        vec![xid.clone()],
        "{xid} should still be prepared"
    );
    assert_eq!(ids, (0..50).collect::<Vec<_>>(), "{xid} is not visible");

    // Clean up: the session that prepared rolls its transaction back.
    held.query_drop(format!("XA ROLLBACK '{xid}'"))
        .await
        .unwrap();
    held.disconnect().await.unwrap();
    let (ids, prepared) = read_sorted(&table, &scope);
    assert_eq!(ids, (0..50).collect::<Vec<_>>());
    assert!(prepared.is_empty(), "prepared left: {prepared:?}");
}

/// Recovery meets an undecided transaction (in no durable checkpoint) still attached to the session that
/// prepared it, holding the owner row: it fails retryable naming it within its bounded wait (before: rolling it
/// back "succeeded" on "unknown XID", and the owner row stayed locked through 15 lock timeouts, reported as an
/// open, not prepared, transaction). Once that session ended, recovery rolls it back: its rows never appear.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_names_an_undecided_transaction_still_attached() {
    let (table, scope) = names("undecided");
    let sink_config = config(Db::MariaDb, &sink_id(), 0, &table, &scope, WriteMode::Xa);

    // Checkpoint 1 is decided and committed by a first instance (owner epoch 1).
    let mut first = JdbcSink::new(sink_config.clone()).await.unwrap();
    first.recover(None).await.unwrap();
    first.begin(CheckpointId(1)).await.unwrap();
    first.write(&batch(0..10)).await.unwrap();
    let decided = first.pre_commit(CheckpointId(1)).await.unwrap();
    first
        .committer()
        .commit(vec![decided.clone()])
        .await
        .unwrap();
    drop(first);

    // Checkpoint 2 was prepared (owner check passed at epoch 1) but its record never became durable; the
    // session that prepared it is still on the server.
    let (held, xid) = prepare_in_held_session(&table, &scope, 2, 10..20, Some(1)).await;

    let mut second = JdbcSink::new(sink_config).await.unwrap();
    let started = Instant::now();
    let err = second
        .recover(Some((CheckpointId(1), vec![decided.clone()])))
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert_eq!(err.kind(), ErrorKind::Retryable, "{err}");
    assert!(err.to_string().contains(&xid), "{err}");
    // 15 owner-row lock timeouts of 1 s each would take more than 15 s.
    assert!(
        took < Duration::from_secs(14),
        "recovery should stop within its bounded wait: {took:?}"
    );
    println!("recovery with {xid} attached failed after {took:?}: {err}");
    let (ids, prepared) = read_sorted(&table, &scope);
    assert_eq!(prepared, vec![xid.clone()], "{xid} is still prepared");
    assert_eq!(ids, (0..10).collect::<Vec<_>>(), "{xid} is not visible");

    held.disconnect().await.unwrap();
    second
        .recover(Some((CheckpointId(1), vec![decided])))
        .await
        .unwrap();
    let (ids, prepared) = read_sorted(&table, &scope);
    assert_eq!(
        ids,
        (0..10).collect::<Vec<_>>(),
        "{xid} was rolled back, checkpoint 1 stays"
    );
    assert!(prepared.is_empty(), "prepared left: {prepared:?}");
    assert_eq!(
        cli(
            Db::MariaDb,
            &format!(
                "SELECT COUNT(*) FROM ratchet_xa_commits WHERE sink = '{scope}' AND subtask = 0 AND checkpoint = 2"
            )
        ),
        "0",
        "the marker of {xid} went with it"
    );
}
