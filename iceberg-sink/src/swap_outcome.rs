//! Where one of Ratchet's own catalog commits ended ([`crate::own_commit`]).

use iceberg::table::Table;

/// Where a commit ended.
#[derive(Debug)]
pub(crate) enum SwapOutcome {
    /// The catalog now names the new metadata: the table as committed.
    Committed(Box<Table>),
    /// Another writer moved the table first; nothing was committed.
    Conflict,
}
