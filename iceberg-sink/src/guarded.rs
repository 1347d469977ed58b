//! A catalog wrapper that checks the table every time iceberg-rust loads it to commit.
//!
//! iceberg-rust 0.10's `Transaction::commit` reloads the table, re-applies its actions on the fresh metadata and
//! sends them with requirements derived from that fresh metadata (the main branch's snapshot id), retrying
//! conflicts by doing all of it again. It has no custom commit conditions. Wrapping the catalog puts Ratchet's
//! conditions (this instance still owns the subtask; the checkpoint is not in the table yet) on exactly the
//! metadata the commit is built from: whatever changes the main branch after the check makes the catalog refuse
//! the commit, and the retry checks again.
//!
//! In capturing mode ([`GuardedCatalog::capturing`]) the wrapper does not forward the commit: it keeps the
//! requirements and updates iceberg planned, for Ratchet's own commit to change (manifest merging) and send
//! ([`crate::metadata_swap`]).

use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;

use async_trait::async_trait;
use iceberg::table::Table;
use iceberg::{
    Catalog, Namespace, NamespaceIdent, Result, TableCommit, TableCreation, TableIdent,
    TableRequirement, TableUpdate,
};

/// Why a guarded load stopped the commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// A newer instance owns the subtask (its epoch is given).
    Fenced(u64),
    /// The table already shows everything the commit would add.
    AlreadyCommitted,
}

/// The condition: `Ok` lets the commit be built on this table.
pub(crate) type Check<'a> = dyn Fn(&Table) -> std::result::Result<(), Verdict> + Send + Sync + 'a;

/// Delegates to `inner`; `load_table` runs `check` and fails (not retryably) when it says no, keeping the verdict.
pub(crate) struct GuardedCatalog<'a> {
    inner: &'a dyn Catalog,
    check: &'a Check<'a>,
    verdict: Mutex<Option<Verdict>>,
    base: Mutex<Option<Table>>,
    capture: bool,
    captured: Mutex<Option<Planned>>,
}

/// A commit iceberg planned and a capturing [`GuardedCatalog`] kept instead of sending.
#[derive(Debug)]
pub(crate) struct Planned {
    /// The table it was planned on (the guarded load the check accepted).
    pub(crate) base: Table,
    /// What the catalog must check before applying it.
    pub(crate) requirements: Vec<TableRequirement>,
    /// The metadata changes.
    pub(crate) updates: Vec<TableUpdate>,
}

impl<'a> GuardedCatalog<'a> {
    pub(crate) fn new(inner: &'a dyn Catalog, check: &'a Check<'a>) -> Self {
        Self {
            inner,
            check,
            verdict: Mutex::new(None),
            base: Mutex::new(None),
            capture: false,
            captured: Mutex::new(None),
        }
    }

    /// The same wrapper, but `update_table` keeps the planned commit ([`Self::take_planned`]) instead of sending
    /// it, and answers with the base table.
    pub(crate) fn capturing(mut self) -> Self {
        self.capture = true;
        self
    }

    /// The commit a capturing wrapper kept, if iceberg planned one.
    pub(crate) fn take_planned(&self) -> Option<Planned> {
        self.captured.lock().expect("captured lock").take()
    }

    /// The last load the check accepted: what a commit that succeeded was built on.
    pub(crate) fn base(&self) -> Option<Table> {
        self.base.lock().expect("base lock").clone()
    }

    /// The verdict of the load that stopped the commit, if one did.
    pub(crate) fn verdict(&self) -> Option<Verdict> {
        self.verdict.lock().expect("verdict lock").clone()
    }
}

impl fmt::Debug for GuardedCatalog<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GuardedCatalog")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl Catalog for GuardedCatalog<'_> {
    async fn load_table(&self, table: &TableIdent) -> Result<Table> {
        let loaded = self.inner.load_table(table).await?;
        if let Err(verdict) = (self.check)(&loaded) {
            *self.verdict.lock().expect("verdict lock") = Some(verdict.clone());
            return Err(iceberg::Error::new(
                iceberg::ErrorKind::PreconditionFailed,
                format!("ratchet stopped the commit to {table}: {verdict:?}"),
            ));
        }
        *self.base.lock().expect("base lock") = Some(loaded.clone());
        Ok(loaded)
    }

    async fn update_table(&self, mut commit: TableCommit) -> Result<Table> {
        if !self.capture {
            return self.inner.update_table(commit).await;
        }
        let base = self.base().ok_or_else(|| {
            iceberg::Error::new(
                iceberg::ErrorKind::Unexpected,
                "a commit was planned on a table the guard never loaded",
            )
        })?;
        *self.captured.lock().expect("captured lock") = Some(Planned {
            base: base.clone(),
            requirements: commit.take_requirements(),
            updates: commit.take_updates(),
        });
        Ok(base)
    }

    async fn list_namespaces(
        &self,
        parent: Option<&NamespaceIdent>,
    ) -> Result<Vec<NamespaceIdent>> {
        self.inner.list_namespaces(parent).await
    }

    async fn create_namespace(
        &self,
        namespace: &NamespaceIdent,
        properties: HashMap<String, String>,
    ) -> Result<Namespace> {
        self.inner.create_namespace(namespace, properties).await
    }

    async fn get_namespace(&self, namespace: &NamespaceIdent) -> Result<Namespace> {
        self.inner.get_namespace(namespace).await
    }

    async fn namespace_exists(&self, namespace: &NamespaceIdent) -> Result<bool> {
        self.inner.namespace_exists(namespace).await
    }

    async fn update_namespace(
        &self,
        namespace: &NamespaceIdent,
        properties: HashMap<String, String>,
    ) -> Result<()> {
        self.inner.update_namespace(namespace, properties).await
    }

    async fn drop_namespace(&self, namespace: &NamespaceIdent) -> Result<()> {
        self.inner.drop_namespace(namespace).await
    }

    async fn list_tables(&self, namespace: &NamespaceIdent) -> Result<Vec<TableIdent>> {
        self.inner.list_tables(namespace).await
    }

    async fn create_table(
        &self,
        namespace: &NamespaceIdent,
        creation: TableCreation,
    ) -> Result<Table> {
        self.inner.create_table(namespace, creation).await
    }

    async fn drop_table(&self, table: &TableIdent) -> Result<()> {
        self.inner.drop_table(table).await
    }

    async fn purge_table(&self, table: &TableIdent) -> Result<()> {
        self.inner.purge_table(table).await
    }

    async fn table_exists(&self, table: &TableIdent) -> Result<bool> {
        self.inner.table_exists(table).await
    }

    async fn rename_table(&self, src: &TableIdent, dest: &TableIdent) -> Result<()> {
        self.inner.rename_table(src, dest).await
    }

    async fn register_table(&self, table: &TableIdent, metadata_location: String) -> Result<Table> {
        self.inner.register_table(table, metadata_location).await
    }
}
