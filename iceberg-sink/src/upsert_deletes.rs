//! The upsert mode's choice of delete files (`upsert_deletes`).

/// How the upsert mode (`upsert_key`) deletes the row a checkpoint's upsert or delete of a key replaces.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum UpsertDeletes {
    /// Position-delete files naming the replaced rows (data file and position), found by the sink's key index
    /// (`key_index.rs`): read by every engine that reads format-version 2 deletes (pyiceberg and DuckDB too), and
    /// costing a reader nothing per older snapshot. The index holds every key of the table in memory per subtask
    /// and is rebuilt from the table at recovery.
    #[default]
    Position,
    /// Equality-delete files holding the keys: no index, but readers must apply equality deletes (pyiceberg 0.12
    /// refuses them, DuckDB 1.4.4 misreads them) and their cost grows with every commit until the table is
    /// rewritten.
    Equality,
}
