//! Schema evolution of the table. `evolution = "add-columns"`: the batches' columns the table lacks are added as
//! optional columns, in one schema update through the catalog (iceberg-rust's `UpdateSchemaAction`, committed with
//! the requirement that the table's current schema is the one it was built on). `evolution = "evolve"` also
//! widens the columns whose batches' type is wider (int to long, float to double, a decimal's precision up: the
//! promotions Iceberg's spec allows) and makes optional the required columns whose batches take nulls, in a second
//! schema update committed by Ratchet's own catalog commit (iceberg-rust 0.10 has no update-column action): a new
//! schema with the same field ids, made current under the requirement that the current schema is still the one
//! it was built from. Nothing is written when the table already fits, so an instance opening an evolved table
//! changes nothing.
//!
//! Two instances changing the schema at once: the loser's commit fails its requirement (or its add is refused
//! because the column exists by then); the table is loaded again and the changes counted again, a few times at
//! most. A commit whose outcome is unknown is found out the same way. A data file written before the change lacks
//! a new column (readers see null there, which is also what a record without the field means) and holds a widened
//! column's values in the narrower type, which every Iceberg reader promotes.

use std::sync::Arc;

use arrow_schema::{Field, SchemaRef};
use connector_api::{Error, ErrorKind, Evolution, Phase, Result, SinkId};
use iceberg::spec::{ListType, MapType, NestedField, PrimitiveType, StructType, Type};
use iceberg::table::Table;
use iceberg::transaction::{AddColumn, ApplyTransactionAction, Transaction};
use iceberg::{TableRequirement, TableUpdate};

use crate::commit::TableTarget;
use crate::error::iceberg_error;
use crate::swap_outcome::SwapOutcome;
use crate::types;

/// How many times a schema update that lost a race is tried again.
const ATTEMPTS: u32 = 4;

/// Changes the table as `evolution` allows so that it takes batches of `schema`: adds the columns it lacks, then
/// (`evolve`) widens and makes optional the columns that need it. Returns the table as it then is.
///
/// # Errors
/// As [`add_missing_columns`] and [`change_columns`].
pub(crate) async fn evolve_table(
    target: &TableTarget,
    schema: &SchemaRef,
    sink: &SinkId,
    evolution: Evolution,
) -> Result<Table> {
    let table = match evolution.adds_columns() {
        true => add_missing_columns(target, schema, sink).await?,
        false => target.load(Phase::Setup).await?,
    };
    match evolution.changes_columns() {
        true => change_columns(target, schema, sink).await,
        false => Ok(table),
    }
}

/// Adds the columns of `schema` the table lacks; returns the table as it then is.
///
/// # Errors
/// [`Retryable`](ErrorKind::Retryable) when the catalog cannot be reached or the update kept losing races;
/// [`Config`](ErrorKind::Config) when a column has no exact Iceberg type ([`crate::types`]).
async fn add_missing_columns(
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

/// The table's top-level field as the batches' column `field` needs it: its type widened (nested: fields added,
/// with ids after `next_id`, widened or made optional), optional where the column takes nulls; `None` when the
/// field already takes the column's values (or cannot: the fit check refuses it then, naming it).
fn changed_field(current: &NestedField, field: &Field, next_id: &mut i32) -> Option<NestedField> {
    let (wanted, _) = types::fields_of(std::iter::once(field), &mut 0);
    let wanted = wanted.first()?;
    evolved_field(current, wanted, next_id)
}

/// `current` changed to take the values of `wanted` (a field built from the batches, its ids placeholders): its
/// type evolved ([`evolved_type`]) and `required` lifted where `wanted` is optional; `None` when nothing changes.
fn evolved_field(
    current: &NestedField,
    wanted: &NestedField,
    next_id: &mut i32,
) -> Option<NestedField> {
    let mut changed = current.clone();
    if let Some(ty) = evolved_type(&current.field_type, &wanted.field_type, next_id) {
        changed.field_type = Box::new(ty);
    }
    if current.required && !wanted.required {
        changed.required = false;
    }
    (changed != *current).then_some(changed)
}

/// `current` changed to take the values of `wanted`: a primitive promoted ([`promotes`]); a struct with the fields
/// it lacks appended (optional, fresh ids after `next_id`) and its fields evolved; a list's element or a map's value evolved.
/// `None` when nothing changes.
fn evolved_type(current: &Type, wanted: &Type, next_id: &mut i32) -> Option<Type> {
    match (current, wanted) {
        (Type::Primitive(from), Type::Primitive(to)) => promotes(from, to).then(|| wanted.clone()),
        (Type::Struct(have), Type::Struct(want)) => {
            let mut changed = false;
            let mut fields: Vec<_> = have
                .fields()
                .iter()
                .map(|f| {
                    match want
                        .field_by_name(&f.name)
                        .and_then(|w| evolved_field(f, w, next_id))
                    {
                        Some(evolved) => {
                            changed = true;
                            Arc::new(evolved)
                        }
                        None => f.clone(),
                    }
                })
                .collect();
            for added in want
                .fields()
                .iter()
                .filter(|w| have.field_by_name(&w.name).is_none())
            {
                changed = true;
                // Optional whatever the batches say: the data files written before it lack it (Iceberg refuses a
                // required field that is not in a file).
                let mut field = with_fresh_ids(added, next_id);
                field.required = false;
                fields.push(Arc::new(field));
            }
            changed.then(|| Type::Struct(StructType::new(fields)))
        }
        (Type::List(have), Type::List(want)) => {
            let element = evolved_field(&have.element_field, &want.element_field, next_id)?;
            Some(Type::List(ListType {
                element_field: Arc::new(element),
            }))
        }
        (Type::Map(have), Type::Map(want)) => {
            let value = evolved_field(&have.value_field, &want.value_field, next_id)?;
            Some(Type::Map(MapType {
                key_field: have.key_field.clone(),
                value_field: Arc::new(value),
            }))
        }
        _ => None,
    }
}

/// `field` (built from the batches, its ids placeholders) with ids after `next_id`, its nested fields' too.
fn with_fresh_ids(field: &NestedField, next_id: &mut i32) -> NestedField {
    *next_id += 1;
    let id = *next_id;
    let field_type = match field.field_type.as_ref() {
        Type::Struct(fields) => Type::Struct(StructType::new(
            fields
                .fields()
                .iter()
                .map(|f| Arc::new(with_fresh_ids(f, next_id)))
                .collect(),
        )),
        Type::List(list) => Type::List(ListType {
            element_field: Arc::new(with_fresh_ids(&list.element_field, next_id)),
        }),
        Type::Map(map) => Type::Map(MapType {
            key_field: Arc::new(with_fresh_ids(&map.key_field, next_id)),
            value_field: Arc::new(with_fresh_ids(&map.value_field, next_id)),
        }),
        primitive => primitive.clone(),
    };
    NestedField {
        id,
        field_type: Box::new(field_type),
        ..field.clone()
    }
}

/// The table's top-level columns [`change_columns`] would change for batches of `schema` (read only).
pub(crate) fn changed_columns(table: &Table, schema: &arrow_schema::Schema) -> Vec<String> {
    let mut next_id = table.metadata().last_column_id();
    table
        .metadata()
        .current_schema()
        .as_struct()
        .fields()
        .iter()
        .filter(|f| {
            schema
                .field_with_name(&f.name)
                .is_ok_and(|column| changed_field(f, column, &mut next_id).is_some())
        })
        .map(|f| f.name.clone())
        .collect()
}

/// Whether Iceberg's spec lets a column of type `from` be promoted to `to`.
fn promotes(from: &PrimitiveType, to: &PrimitiveType) -> bool {
    match (from, to) {
        (PrimitiveType::Int, PrimitiveType::Long)
        | (PrimitiveType::Float, PrimitiveType::Double) => true,
        (
            PrimitiveType::Decimal {
                precision: p1,
                scale: s1,
            },
            PrimitiveType::Decimal {
                precision: p2,
                scale: s2,
            },
        ) => s1 == s2 && p1 < p2,
        _ => false,
    }
}

/// `evolution = "evolve"`: widens the table's columns whose batches' type is wider and makes optional the ones
/// whose batches take nulls (top-level columns; the field ids stay); returns the table as it then is.
///
/// # Errors
/// [`Retryable`](ErrorKind::Retryable) when the catalog cannot be reached, a commit's outcome stayed unknown or
/// the update kept losing races; [`Config`](ErrorKind::Config) when the catalog has no commit Ratchet can make.
async fn change_columns(target: &TableTarget, schema: &SchemaRef, sink: &SinkId) -> Result<Table> {
    let own = target.own_commit().ok_or_else(|| {
        Error::new(
            ErrorKind::Config,
            Phase::Setup,
            format!(
                "widening columns of table {} needs Ratchet's own catalog commit, which this catalog lacks",
                target.table
            ),
        )
        .with_sink(sink)
    })?;
    let mut attempt = 0;
    loop {
        attempt += 1;
        let table = target.load(Phase::Setup).await?;
        let current = table.metadata().current_schema();
        let mut next_id = table.metadata().last_column_id();
        let mut changed = Vec::new();
        let fields: Vec<_> = current
            .as_struct()
            .fields()
            .iter()
            .map(|f| {
                let Ok(column) = schema.field_with_name(&f.name) else {
                    return f.clone();
                };
                match changed_field(f, column, &mut next_id) {
                    Some(new) => {
                        changed.push(f.name.clone());
                        Arc::new(new)
                    }
                    None => f.clone(),
                }
            })
            .collect();
        if changed.is_empty() {
            return Ok(table);
        }
        let names = changed.join(", ");
        let evolved = iceberg::spec::Schema::builder()
            .with_schema_id(current.schema_id() + 1)
            .with_fields(fields)
            .with_identifier_field_ids(current.identifier_field_ids())
            .build()
            .map_err(|e| {
                iceberg_error(
                    Phase::Setup,
                    format!(
                        "cannot build table {}'s schema with {names} changed",
                        target.table
                    ),
                    e,
                )
                .with_sink(sink)
            })?;
        let requirements = vec![TableRequirement::CurrentSchemaIdMatch {
            current_schema_id: current.schema_id(),
        }];
        let updates = vec![
            TableUpdate::AddSchema { schema: evolved },
            TableUpdate::SetCurrentSchema { schema_id: -1 },
        ];
        let outcome = tokio::time::timeout(
            target.commit_timeout,
            own.commit(&table, requirements, updates),
        )
        .await;
        let failure = match outcome {
            Ok(Ok(SwapOutcome::Committed(table))) => {
                tracing::info!(%sink, table = %target.table, columns = %names,
                    "widened the table's columns (or made them optional) for the batches' schema");
                return Ok(*table);
            }
            Ok(Ok(SwapOutcome::Conflict)) => "another writer moved the table first".to_string(),
            Ok(Err(e)) if e.kind() == iceberg::ErrorKind::DataInvalid => {
                return Err(iceberg_error(
                    Phase::Setup,
                    format!(
                        "the catalog refused to change column(s) {names} of table {}",
                        target.table
                    ),
                    e,
                )
                .with_kind(ErrorKind::Config)
                .with_sink(sink));
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("the commit took longer than {:?}", target.commit_timeout),
        };
        // The table is loaded again: whether the change is there decides (an unknown outcome included).
        if attempt >= ATTEMPTS {
            return Err(Error::new(
                ErrorKind::Retryable,
                Phase::Setup,
                format!(
                    "cannot change column(s) {names} of table {} after {ATTEMPTS} attempts: {failure}",
                    target.table
                ),
            )
            .with_sink(sink));
        }
        tracing::info!(%sink, table = %target.table, %failure,
            "the column change did not commit; loading the table again");
    }
}

#[cfg(test)]
mod tests {
    use arrow_schema::DataType;

    use super::*;

    #[test]
    fn only_iceberg_promotions_and_nulls_change_a_field() {
        let int = NestedField::required(1, "qty", Type::Primitive(PrimitiveType::Int));
        let long = Field::new("qty", DataType::Int64, false);
        let changed = changed_field(&int, &long, &mut 9).unwrap();
        assert_eq!(*changed.field_type, Type::Primitive(PrimitiveType::Long));
        assert!(changed.required && changed.id == 1);
        let optional =
            changed_field(&int, &Field::new("qty", DataType::Int32, true), &mut 9).unwrap();
        assert!(!optional.required);
        assert_eq!(*optional.field_type, Type::Primitive(PrimitiveType::Int));
        assert!(changed_field(&int, &Field::new("qty", DataType::Int16, false), &mut 9).is_none());
        assert!(changed_field(&int, &Field::new("qty", DataType::Utf8, false), &mut 9).is_none());
        let price = NestedField::optional(
            2,
            "price",
            Type::Primitive(PrimitiveType::Decimal {
                precision: 9,
                scale: 2,
            }),
        );
        let wider = changed_field(
            &price,
            &Field::new("price", DataType::Decimal128(12, 2), true),
            &mut 9,
        )
        .unwrap();
        assert_eq!(
            *wider.field_type,
            Type::Primitive(PrimitiveType::Decimal {
                precision: 12,
                scale: 2
            })
        );
        assert!(
            changed_field(
                &price,
                &Field::new("price", DataType::Decimal128(12, 3), true),
                &mut 9,
            )
            .is_none()
        );
        let float = NestedField::optional(3, "ratio", Type::Primitive(PrimitiveType::Float));
        assert!(
            changed_field(
                &float,
                &Field::new("ratio", DataType::Float64, true),
                &mut 9
            )
            .is_some()
        );
    }

    #[test]
    fn a_nested_struct_gains_fields_with_fresh_ids_and_keeps_its_own() {
        let customer = NestedField::optional(
            4,
            "customer",
            Type::Struct(StructType::new(vec![
                NestedField::required(5, "name", Type::Primitive(PrimitiveType::String)).into(),
                NestedField::optional(6, "age", Type::Primitive(PrimitiveType::Int)).into(),
            ])),
        );
        let address =
            DataType::Struct(vec![arrow_schema::Field::new("city", DataType::Utf8, true)].into());
        let column = Field::new(
            "customer",
            DataType::Struct(
                vec![
                    Field::new("name", DataType::Utf8, false),
                    Field::new("age", DataType::Int64, true),
                    // Required in the batches (a Protobuf scalar without presence), optional in the table.
                    Field::new("email", DataType::Utf8, false),
                    Field::new("address", address, true),
                ]
                .into(),
            ),
            true,
        );
        let mut next_id = 6;
        let changed = changed_field(&customer, &column, &mut next_id).unwrap();
        let Type::Struct(fields) = changed.field_type.as_ref() else {
            panic!("{changed:?}")
        };
        let summary: Vec<(i32, &str, bool)> = fields
            .fields()
            .iter()
            .map(|f| (f.id, f.name.as_str(), f.required))
            .collect();
        assert_eq!(
            summary,
            [
                (5, "name", true),
                (6, "age", false),
                (7, "email", false),
                (8, "address", false)
            ]
        );
        assert_eq!(
            *fields.field_by_name("age").unwrap().field_type,
            Type::Primitive(PrimitiveType::Long)
        );
        let Type::Struct(address) = fields.field_by_name("address").unwrap().field_type.as_ref()
        else {
            panic!()
        };
        assert_eq!(address.fields()[0].id, 9);
        assert_eq!(next_id, 9);
        assert_eq!(changed.id, 4);
    }
}
