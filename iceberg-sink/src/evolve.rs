//! Schema evolution of the table (`evolution = "add-columns"`): the batches' columns the table lacks are added as
//! optional columns, in one schema update through the catalog (iceberg-rust's `UpdateSchemaAction`, committed with
//! the requirement that the table's current schema is the one it was built on). Nothing is written when the table
//! has every column, so an instance opening an evolved table changes nothing.
//!
//! Two instances adding the same column at once: the loser's commit fails its requirement (or its add is refused
//! because the column exists by then); the table is loaded again and the columns counted again, a few times at
//! most. A data file written before the change lacks the column: readers see null there, which is also what a
//! record without the field means.

use arrow_schema::SchemaRef;
use connector_api::{Error, ErrorKind, Phase, Result, SinkId};
use iceberg::table::Table;
use iceberg::transaction::{AddColumn, ApplyTransactionAction, Transaction};

use crate::commit::TableTarget;
use crate::error::iceberg_error;
use crate::types;

/// How many times a schema update that lost a race is tried again.
const ATTEMPTS: u32 = 4;

/// Adds the columns of `schema` the table lacks; returns the table as it then is.
///
/// # Errors
/// [`Retryable`](ErrorKind::Retryable) when the catalog cannot be reached or the update kept losing races;
/// [`Config`](ErrorKind::Config) when a column has no exact Iceberg type ([`crate::types`]).
pub(crate) async fn add_missing_columns(
    target: &TableTarget,
    schema: &SchemaRef,
    sink: &SinkId,
) -> Result<Table> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let table = target.load(Phase::Setup).await?;
        let current = table.metadata().current_schema();
        let missing: Vec<_> = schema
            .fields()
            .iter()
            .filter(|f| current.field_by_name(f.name()).is_none())
            .cloned()
            .collect();
        if missing.is_empty() {
            return Ok(table);
        }
        let names: Vec<String> = missing.iter().map(|f| f.name().clone()).collect();
        // Ids are placeholders: the schema update assigns the table's next ones.
        let (typed, refusals) = types::fields_of(missing.iter().map(|f| f.as_ref()), &mut 0);
        if !refusals.is_empty() {
            return Err(types::refused(sink, &target.table.to_string(), &refusals));
        }
        let mut update = Transaction::new(&table).update_schema();
        for field in typed {
            update = update.add_column(AddColumn::optional(
                &field.name,
                (*field.field_type).clone(),
            ));
        }
        let committed = match update.apply(Transaction::new(&table)) {
            Ok(transaction) => tokio::time::timeout(
                target.commit_timeout,
                transaction.commit(target.catalog.as_ref()),
            )
            .await
            .map_err(|_| {
                Error::new(
                    ErrorKind::Retryable,
                    Phase::Setup,
                    format!(
                        "adding column(s) {} to table {} took longer than {:?}",
                        names.join(", "),
                        target.table,
                        target.commit_timeout
                    ),
                )
            })?,
            Err(e) => Err(e),
        };
        match committed {
            Ok(table) => {
                tracing::info!(%sink, table = %target.table, columns = %names.join(", "),
                    "added the batches' new columns to the table");
                return Ok(table);
            }
            // Another instance changed the schema meanwhile (perhaps adding these very columns): count again.
            Err(e) if attempt < ATTEMPTS => {
                tracing::info!(%sink, table = %target.table, error = %e,
                    "the schema update lost a race; loading the table again");
            }
            Err(e) => {
                return Err(iceberg_error(
                    Phase::Setup,
                    format!(
                        "cannot add column(s) {} to table {}",
                        names.join(", "),
                        target.table
                    ),
                    e,
                )
                .with_kind(ErrorKind::Retryable)
                .with_sink(sink));
            }
        }
    }
}
