//! The commit's conditions under the races iceberg-rust leaves to the caller, forced at the exact moment: a
//! replacement recovers between the load a zombie's commit is built on and the catalog update; the catalog
//! applies a commit but the reply is lost (as a REST 5xx would); two processes commit the same checkpoint at
//! once. On a SQLite catalog with a local warehouse and (the fence and the concurrent commit) on SeaweedFS's REST
//! catalog; the fence and the concurrent commit also through Ratchet's own commit (the SQL compare-and-swap, the
//! REST commit endpoint: the tables the sink creates merge manifests), and a reply of Ratchet's own commit lost on
//! a real network (Toxiproxy, PostgreSQL and REST catalogs); read back by pyiceberg and DuckDB.

use crate::common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use common::Lake;
use connector_api::{CheckpointId, ErrorKind, SinkId, SubtaskId};
use futures::future::BoxFuture;
use iceberg::spec::DataFile;
use iceberg::table::Table;
use iceberg::{Catalog, Namespace, NamespaceIdent, TableCommit, TableCreation, TableIdent};
use iceberg_sink::{CheckpointWriter, CommitOutcome, IcebergSink, SubtaskKey, TableTarget};
use ratchet_conformance::{conformance_batch, conformance_schema};

type Hook = Box<dyn FnOnce() -> BoxFuture<'static, ()> + Send>;

/// Delegates to `inner`; runs `after_checked_load` once right after the second `load_table` (a fresh target's
/// commit loads once to seed its plan and once through its guard: the load the commit is checked against and
/// built on) and before returning it, so the commit goes on with what is now stale metadata on either commit
/// path ([`arm`](Self::arm) installs a hook later, for another load); answers the first update with an error
/// after applying it when `lose_first_reply`.
#[derive(Default)]
struct Interposing {
    inner: Option<Arc<dyn Catalog>>,
    after_checked_load: Mutex<Option<Hook>>,
    lose_first_reply: bool,
    updates: Mutex<u32>,
    loads: Mutex<u32>,
    /// The load after which the hook runs (0: the second).
    hook_at: Mutex<u32>,
}

impl std::fmt::Debug for Interposing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Interposing")
    }
}

impl Interposing {
    fn inner(&self) -> &dyn Catalog {
        self.inner.as_deref().unwrap()
    }

    /// Runs `hook` right after the `nth` load from now (1: the next one; a seeded target's commit loads once).
    fn arm(&self, nth: u32, hook: Hook) {
        *self.hook_at.lock().unwrap() = *self.loads.lock().unwrap() + nth;
        *self.after_checked_load.lock().unwrap() = Some(hook);
    }
}

#[async_trait]
impl Catalog for Interposing {
    async fn update_table(&self, commit: TableCommit) -> iceberg::Result<Table> {
        let first = {
            let mut updates = self.updates.lock().unwrap();
            *updates += 1;
            *updates == 1
        };
        let applied = self.inner().update_table(commit).await?;
        if self.lose_first_reply && first {
            return Err(iceberg::Error::new(
                iceberg::ErrorKind::Unexpected,
                "HTTP 503 Service Unavailable (simulated: the catalog applied the commit, the reply was lost)",
            ));
        }
        Ok(applied)
    }
    async fn load_table(&self, table: &TableIdent) -> iceberg::Result<Table> {
        let loaded = self.inner().load_table(table).await?;
        let second = {
            let mut loads = self.loads.lock().unwrap();
            *loads += 1;
            let at = *self.hook_at.lock().unwrap();
            *loads == if at == 0 { 2 } else { at }
        };
        let hook = second
            .then(|| self.after_checked_load.lock().unwrap().take())
            .flatten();
        if let Some(hook) = hook {
            hook().await;
        }
        Ok(loaded)
    }
    async fn list_namespaces(
        &self,
        p: Option<&NamespaceIdent>,
    ) -> iceberg::Result<Vec<NamespaceIdent>> {
        self.inner().list_namespaces(p).await
    }
    async fn create_namespace(
        &self,
        n: &NamespaceIdent,
        p: HashMap<String, String>,
    ) -> iceberg::Result<Namespace> {
        self.inner().create_namespace(n, p).await
    }
    async fn get_namespace(&self, n: &NamespaceIdent) -> iceberg::Result<Namespace> {
        self.inner().get_namespace(n).await
    }
    async fn namespace_exists(&self, n: &NamespaceIdent) -> iceberg::Result<bool> {
        self.inner().namespace_exists(n).await
    }
    async fn update_namespace(
        &self,
        n: &NamespaceIdent,
        p: HashMap<String, String>,
    ) -> iceberg::Result<()> {
        self.inner().update_namespace(n, p).await
    }
    async fn drop_namespace(&self, n: &NamespaceIdent) -> iceberg::Result<()> {
        self.inner().drop_namespace(n).await
    }
    async fn list_tables(&self, n: &NamespaceIdent) -> iceberg::Result<Vec<TableIdent>> {
        self.inner().list_tables(n).await
    }
    async fn create_table(&self, n: &NamespaceIdent, c: TableCreation) -> iceberg::Result<Table> {
        self.inner().create_table(n, c).await
    }
    async fn drop_table(&self, t: &TableIdent) -> iceberg::Result<()> {
        self.inner().drop_table(t).await
    }
    async fn purge_table(&self, t: &TableIdent) -> iceberg::Result<()> {
        self.inner().purge_table(t).await
    }
    async fn table_exists(&self, t: &TableIdent) -> iceberg::Result<bool> {
        self.inner().table_exists(t).await
    }
    async fn rename_table(&self, s: &TableIdent, d: &TableIdent) -> iceberg::Result<()> {
        self.inner().rename_table(s, d).await
    }
    async fn register_table(&self, t: &TableIdent, m: String) -> iceberg::Result<Table> {
        self.inner().register_table(t, m).await
    }
}

struct Setup {
    lake: Lake,
    table: String,
    ident: TableIdent,
    catalog: Arc<dyn Catalog>,
    key: SubtaskKey,
}

/// A lake of the given kind: `sqlite` (SQLite catalog, local warehouse), `postgres` (PostgreSQL catalog, local
/// warehouse) or `rest` (SeaweedFS's REST catalog).
async fn setup(kind: &str, label: &str) -> (tempfile::TempDir, Setup) {
    let dir = tempfile::tempdir().unwrap();
    let lake = match kind {
        "rest" => Lake::rest(label),
        "postgres" => Lake::postgres_local(dir.path(), label),
        _ => Lake::sqlite_local(dir.path(), label),
    };
    let table = lake.table(&["events"]);
    let sink = SinkId::new("lake").unwrap();
    // Creates the namespace and table.
    IcebergSink::new(lake.config("races", &sink, 0, &table, conformance_schema()))
        .await
        .unwrap();
    let catalog = lake.catalog.open("ratchet", &lake.s3).await.unwrap();
    let ident = TableIdent::from_strs(table.split('.')).unwrap();
    let key = SubtaskKey {
        job: SinkId::new("races").unwrap(),
        sink,
        subtask: SubtaskId(0),
    };
    (
        dir,
        Setup {
            lake,
            table,
            ident,
            catalog,
            key,
        },
    )
}

impl Setup {
    /// A target committing through iceberg's `Transaction::commit`.
    fn target(&self, catalog: Arc<dyn Catalog>) -> TableTarget {
        TableTarget::new(catalog, self.ident.clone(), Duration::from_secs(30))
    }

    /// A target committing through Ratchet's own commit (the sink's tables ask for manifest merging).
    fn own_target(&self, catalog: Arc<dyn Catalog>) -> TableTarget {
        self.target(catalog)
            .with_own_commit(&self.lake.catalog, "ratchet")
            .unwrap()
    }

    fn target_for(&self, own: bool, catalog: Arc<dyn Catalog>) -> TableTarget {
        if own {
            self.own_target(catalog)
        } else {
            self.target(catalog)
        }
    }

    async fn files(&self, name: &str, ids: std::ops::Range<i64>) -> Vec<DataFile> {
        let table = self.catalog.load_table(&self.ident).await.unwrap();
        let mut writer =
            CheckpointWriter::open(&table, format!("{}{name}", self.key.file_prefix()), 1 << 27)
                .await
                .unwrap();
        writer.write(&conformance_batch(ids)).await.unwrap();
        writer.close().await.unwrap()
    }

    async fn read(&self) -> common::Seen {
        let (lake, table) = (self.lake.clone(), self.table.clone());
        let seen = tokio::task::spawn_blocking(move || lake.read(&table))
            .await
            .unwrap();
        assert_eq!(seen.ids, seen.duckdb_ids, "pyiceberg and DuckDB agree");
        seen
    }
}

fn data_snapshots(seen: &common::Seen) -> usize {
    seen.snapshots
        .iter()
        .filter(|s| {
            s["summary"]["added-data-files"]
                .as_str()
                .is_some_and(|n| n != "0")
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovery_between_a_zombies_checked_load_and_its_update_fences_the_zombie() {
    recovery_between_load_and_update("sqlite", false).await;
    recovery_between_load_and_update("sqlite", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovery_between_a_zombies_checked_load_and_its_update_fences_the_zombie_on_rest() {
    recovery_between_load_and_update("rest", false).await;
    recovery_between_load_and_update("rest", true).await;
}

/// With `own`, the zombie commits through Ratchet's own commit (the replacement recovers through iceberg's).
async fn recovery_between_load_and_update(kind: &str, own: bool) {
    let (_dir, s) = setup(kind, "zombie").await;
    let (zombie_epoch, _) = s
        .target(s.catalog.clone())
        .raise_epoch(&s.key)
        .await
        .unwrap();
    let files = s.files("zombie", 0..40).await;

    // The replacement recovers after the zombie's commit was built on (and checked against) fresh metadata.
    let replacement = s.target(s.catalog.clone());
    let key = s.key.clone();
    let interposing = Interposing {
        inner: Some(s.catalog.clone()),
        after_checked_load: Mutex::new(Some(Box::new(move || {
            Box::pin(async move {
                let (epoch, _) = replacement.raise_epoch(&key).await.unwrap();
                assert_eq!(epoch, zombie_epoch + 1);
            })
        }))),
        ..Interposing::default()
    };
    let err = s
        .target_for(own, Arc::new(interposing))
        .commit_files(&s.key, zombie_epoch, CheckpointId(2), files)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Fenced, "own commit: {own}: {err}");
    let seen = s.read().await;
    assert!(
        seen.ids.is_empty(),
        "the zombie's rows became visible: {:?}",
        seen.ids.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_is_retried_by_checking_the_history_first() {
    let (_dir, s) = setup("sqlite", "lost").await;
    let (epoch, _) = s
        .target(s.catalog.clone())
        .raise_epoch(&s.key)
        .await
        .unwrap();
    let files = s.files("lost", 0..40).await;
    let lossy = s.target(Arc::new(Interposing {
        inner: Some(s.catalog.clone()),
        lose_first_reply: true,
        ..Interposing::default()
    }));
    let err = lossy
        .commit_files(&s.key, epoch, CheckpointId(2), files.clone())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Retryable, "{err}");
    assert!(err.to_string().contains("unknown outcome"), "{err}");
    // The retry (what the driver does with a retryable commit error) finds the checkpoint in the history.
    let outcome = lossy
        .commit_files(&s.key, epoch, CheckpointId(2), files)
        .await
        .unwrap();
    assert_eq!(outcome, CommitOutcome::AlreadyCommitted);
    let seen = s.read().await;
    assert_eq!(seen.ids, (0..40).collect::<Vec<_>>());
    assert_eq!(data_snapshots(&seen), 1);
}

/// Ratchet's own commit over a real network whose replies vanish right after the checked load (Toxiproxy): the
/// REST commit reaches the catalog and is applied, its caller never hears back (on PostgreSQL the pool's health
/// check before the swap is what goes unanswered). The commit ends within `commit_timeout` as retryable; the retry
/// through the same target (its pool, its REST session) after the network heals finds the checkpoint in the
/// table's history instead of landing it again, or lands it once when it never left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_of_ratchets_own_commit_over_the_network_is_resolved_by_the_retry() {
    own_commit_reply_lost("postgres").await;
    own_commit_reply_lost("rest").await;
}

async fn own_commit_reply_lost(kind: &str) {
    let (_dir, s) = setup(kind, "lostown").await;
    let proxy = test_support::Services::get()
        .toxiproxy()
        .proxy("lost-own-reply", &s.lake.catalog_server().unwrap())
        .await;
    let interposing = Arc::new(Interposing {
        inner: Some(s.catalog.clone()),
        ..Interposing::default()
    });
    let target = TableTarget::new(interposing.clone(), s.ident.clone(), Duration::from_secs(3))
        .with_own_commit(&s.lake.through(proxy.address()).catalog, "ratchet")
        .unwrap();
    // Through the proxy and Ratchet's own commit (the sink's tables merge manifests): the pool is connected, the
    // REST prefix and token fetched, and the target seeded, so the next commit loads once, checked.
    let (epoch, _) = target.raise_epoch(&s.key).await.unwrap();
    let files = s.files("lostown", 0..40).await;
    let silenced = proxy.clone();
    interposing.arm(
        1,
        Box::new(move || Box::pin(async move { silenced.drop_replies().await })),
    );
    let err = target
        .commit_files(&s.key, epoch, CheckpointId(2), files.clone())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Retryable, "{kind}: {err}");
    let said = connector_api::Report(&err).to_string();
    assert!(said.contains("unknown"), "{kind}: {said}");
    proxy.heal().await;
    let outcome = target
        .commit_files(&s.key, epoch, CheckpointId(2), files)
        .await
        .unwrap();
    if kind == "rest" {
        // The POST went out on the kept-alive connection and was applied.
        assert_eq!(
            outcome,
            CommitOutcome::AlreadyCommitted,
            "{kind}: the commit whose reply was lost had landed"
        );
    } else {
        // sqlx checks a pooled connection with a round trip before the UPDATE: that reply is the one lost, so
        // the swap may never have left (then the retry lands it, once).
        eprintln!("{kind}: the retry found {outcome:?}");
    }
    proxy.delete().await;
    let seen = s.read().await;
    assert_eq!(seen.ids, (0..40).collect::<Vec<_>>(), "{kind}");
    assert_eq!(data_snapshots(&seen), 1, "{kind}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_committing_the_same_checkpoint_at_once_land_it_once() {
    two_commit_at_once("sqlite", false).await;
    two_commit_at_once("sqlite", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_committing_the_same_checkpoint_at_once_land_it_once_on_rest() {
    two_commit_at_once("rest", false).await;
    two_commit_at_once("rest", true).await;
}

/// With `own`, both commit through Ratchet's own commit.
async fn two_commit_at_once(kind: &str, own: bool) {
    let (_dir, s) = setup(kind, "twice").await;
    let (epoch, _) = s
        .target(s.catalog.clone())
        .raise_epoch(&s.key)
        .await
        .unwrap();
    let files = s.files("twice", 0..40).await;
    // Two catalogs (two connection pools), like two processes.
    let other = s.lake.catalog.open("ratchet", &s.lake.s3).await.unwrap();
    let (a, b) = (
        s.target_for(own, s.catalog.clone()),
        s.target_for(own, other),
    );
    let (first, second) = tokio::join!(
        a.commit_files(&s.key, epoch, CheckpointId(2), files.clone()),
        b.commit_files(&s.key, epoch, CheckpointId(2), files),
    );
    let mut outcomes = vec![first.unwrap(), second.unwrap()];
    outcomes.sort_by_key(|o| *o == CommitOutcome::Committed);
    assert_eq!(
        outcomes,
        vec![CommitOutcome::AlreadyCommitted, CommitOutcome::Committed]
    );
    let seen = s.read().await;
    assert_eq!(seen.ids, (0..40).collect::<Vec<_>>());
    assert_eq!(data_snapshots(&seen), 1);
}

/// Instances opening one fresh PostgreSQL database as their SQL catalog at once: opening creates the catalog's
/// tables, which they race on (PostgreSQL refuses the loser of a concurrent `CREATE TABLE IF NOT EXISTS` with a
/// unique violation); every instance opens, the loser by opening again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_opening_a_fresh_postgres_catalog_at_once_all_open() {
    let services = test_support::Services::get();
    let database = test_support::unique_name("fresh_catalog").replace('-', "_");
    services.psql(&format!("CREATE DATABASE {database}"));
    let url = services.pg_url();
    let (base, query) = url
        .split_once('?')
        .map_or((url, None), |(b, q)| (b, Some(q)));
    let server = &base[..base.rfind('/').unwrap()];
    let uri = format!(
        "{server}/{database}{}",
        query.map_or(String::new(), |q| format!("?{q}"))
    );
    let warehouse = tempfile::tempdir().unwrap();
    let config = iceberg_sink::CatalogConfig::Sql {
        uri,
        warehouse: warehouse.path().display().to_string(),
    };
    let s3 = iceberg_sink::S3Settings::default();
    let opened = futures::future::join_all((0..4).map(|_| config.open("fresh", &s3))).await;
    for outcome in opened {
        let catalog = outcome.unwrap_or_else(|e| panic!("{}", connector_api::Report(&e)));
        catalog.list_namespaces(None).await.unwrap();
    }
    services.psql(&format!("DROP DATABASE {database} WITH (FORCE)"));
}
