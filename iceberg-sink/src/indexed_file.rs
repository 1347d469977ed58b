//! A row of the table as the upsert mode's key index ([`crate::key_index`]) and a compaction's moves
//! ([`crate::compaction_moves`]) name it: its data file and position.

use std::sync::Arc;

use iceberg::spec::Struct;

/// A data file the index points into: its path, and the partition spec and partition its rows belong to (what a
/// position-delete file of its rows is filed under).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct IndexedFile {
    pub(crate) path: String,
    pub(crate) spec_id: i32,
    pub(crate) partition: Struct,
}

/// A row: its data file and its position there.
pub(crate) type Row = (Arc<IndexedFile>, u64);
