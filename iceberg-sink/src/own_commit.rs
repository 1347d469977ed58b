//! Ratchet's own catalog commit, for the commits iceberg-rust 0.10 cannot be handed: the SQL catalog's
//! compare-and-swap ([`crate::metadata_swap`]) or the REST catalog's commit endpoint ([`crate::rest_commit`]).

use std::sync::Arc;

use iceberg::table::Table;
use iceberg::{Result, TableRequirement, TableUpdate};

use crate::metadata_swap::SqlMetadataSwap;
use crate::rest_commit::RestCommit;
use crate::swap_outcome::SwapOutcome;

/// Ratchet's own commit to the catalog a table lives in.
#[derive(Debug, Clone)]
pub(crate) enum OwnCommit {
    /// A SQL catalog: the compare-and-swap of this module.
    Sql(SqlMetadataSwap),
    /// A REST catalog: its commit endpoint ([`crate::rest_commit`]).
    Rest(Arc<RestCommit>),
}

impl OwnCommit {
    /// Commits `updates` planned on `base` under `requirements`.
    ///
    /// # Errors
    /// As [`SqlMetadataSwap::commit`] and [`RestCommit::commit`]: `Unexpected` when the outcome is unknown,
    /// `DataInvalid` when the commit was refused for a reason retrying cannot change.
    pub(crate) async fn commit(
        &self,
        base: &Table,
        requirements: Vec<TableRequirement>,
        updates: Vec<TableUpdate>,
    ) -> Result<SwapOutcome> {
        match self {
            OwnCommit::Sql(swap) => swap.commit(base, requirements, updates).await,
            OwnCommit::Rest(rest) => rest.commit(base, requirements, updates).await,
        }
    }
}
