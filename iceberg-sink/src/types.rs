//! The Iceberg sink's half of the type contract (docs/types.md): the Iceberg type each Arrow column is stored as,
//! used alike to create a table (`create_table`), to add columns (`evolution = "add-columns"`), to check a table
//! at start and in `check-config`, and by the writer ([`crate::writer`]), which converts each batch to the
//! table's Arrow schema with [`connector_api::types::exact::convert`].
//!
//! | Arrow | Iceberg | |
//! |---|---|---|
//! | `Boolean` | boolean | |
//! | `Int8`, `Int16`, `Int32`, `UInt8`, `UInt16` / `Int64`, `UInt32` | int / long | `UInt64`: refused (no Iceberg type holds it) |
//! | `Float16`, `Float32` / `Float64` | float / double | |
//! | `Decimal(p, s)`, p ≤ 38 | decimal(p, s) | more digits: refused (Iceberg's limit is 38) |
//! | strings, `Dictionary(_, Utf8)` (Avro enums), JSON and decimal text | string | |
//! | `FixedSizeBinary(16)` marked UUID | string: the UUID's canonical text | iceberg-rust 0.10 writes `uuid` columns without Parquet's UUID annotation, which Iceberg's Java readers then read as bytes; nested, a UUID is fixed(16) |
//! | `FixedSizeBinary(n)` | fixed(n) | |
//! | `Binary`, `LargeBinary` | binary | |
//! | `Date32` | date | |
//! | `Time32(s, ms)`, `Time64(µs)` | time (µs) | `Time64(ns)`: refused |
//! | `Timestamp(s, ms, µs)` without / with a zone | timestamp / timestamptz (µs), widened | nanoseconds: only into a table that has `timestamp_ns` columns (format version 3); created tables are version 2 |
//! | `List`, `Struct`, `Map` | list, struct, map, with field ids, recursively | |
//!
//! Refused everywhere: unions, intervals, durations, `Date64`, `Null`. A table that exists is checked column by
//! column: each batch column must convert exactly into the table's column (a wider integer, a decimal of more
//! scale and digits, a finer unit), or it is refused at start and by `check-config`, naming the field.

use std::sync::Arc;

use arrow_schema::{DataType, Field, Schema, TimeUnit};
use connector_api::types::marks::{Mark, mark};
use connector_api::types::{Refusal, describe, exact, refusals_message};
use connector_api::{Error, ErrorKind, Phase, SinkId};
use iceberg::spec::{ListType, MapType, NestedField, PrimitiveType, StructType, Type};

/// The Iceberg schema of a table created for batches of `schema` (field ids from 1, in order), or every field
/// that has no exact Iceberg type.
///
/// # Errors
/// The refusals, one per field.
pub(crate) fn table_schema(schema: &Schema) -> Result<iceberg::spec::Schema, Vec<Refusal>> {
    let mut ids = 0;
    let (fields, refusals) = fields_of(schema.fields().iter().map(|f| f.as_ref()), &mut ids);
    if !refusals.is_empty() {
        return Err(refusals);
    }
    iceberg::spec::Schema::builder()
        .with_fields(fields)
        .build()
        .map_err(|e| {
            vec![Refusal::new(
                "",
                format!("make no valid Iceberg schema: {e}"),
            )]
        })
}

/// Whether `field`, a column of the batches, is a UUID stored as its text ([the table](self)).
pub(crate) fn uuid_as_text(field: &Field) -> bool {
    field.data_type() == &DataType::FixedSizeBinary(16) && mark(field) == Some(Mark::Uuid)
}

/// The Iceberg fields of the batches' columns `fields` with ids after `ids`, and every refusal.
pub(crate) fn fields_of<'a>(
    fields: impl Iterator<Item = &'a Field>,
    ids: &mut i32,
) -> (Vec<Arc<NestedField>>, Vec<Refusal>) {
    let mut out = Vec::new();
    let mut refusals = Vec::new();
    for field in fields {
        *ids += 1;
        let id = *ids;
        let typed = match uuid_as_text(field) {
            true => Ok(Type::Primitive(PrimitiveType::String)),
            false => iceberg_type(field, ids),
        };
        match typed {
            Ok(ty) => out.push(Arc::new(NestedField::new(
                id,
                field.name(),
                ty,
                !field.is_nullable(),
            ))),
            Err(refusal) => refusals.push(refusal.under(field.name())),
        }
    }
    (out, refusals)
}

/// The Iceberg type of `field`'s values; nested fields take ids after `ids`.
fn iceberg_type(field: &Field, ids: &mut i32) -> Result<Type, Refusal> {
    use DataType::*;
    let primitive = |p: PrimitiveType| Ok(Type::Primitive(p));
    let refuse = |why: String| Err(Refusal::new("", why));
    match field.data_type() {
        Boolean => primitive(PrimitiveType::Boolean),
        Int8 | Int16 | Int32 | UInt8 | UInt16 => primitive(PrimitiveType::Int),
        Int64 | UInt32 => primitive(PrimitiveType::Long),
        UInt64 => refuse(
            "has type UInt64, which no Iceberg type holds (long is signed): a decimal(20, 0) column would".to_string()
                + " need the values converted before the sink",
        ),
        Float16 | Float32 => primitive(PrimitiveType::Float),
        Float64 => primitive(PrimitiveType::Double),
        Decimal32(p, s) | Decimal64(p, s) | Decimal128(p, s) | Decimal256(p, s) => {
            if *s < 0 {
                refuse(format!("has a negative scale ({s}), which Iceberg decimals cannot have"))
            } else if *p > 38 {
                refuse(format!(
                    "has type decimal({p}, {s}); Iceberg decimals hold at most 38 digits"
                ))
            } else {
                primitive(PrimitiveType::Decimal {
                    precision: u32::from(*p),
                    scale: *s as u32,
                })
            }
        }
        Utf8 | LargeUtf8 | Utf8View => primitive(PrimitiveType::String),
        Dictionary(_, values) => iceberg_type(&field.clone().with_data_type(values.as_ref().clone()), ids),
        FixedSizeBinary(n) => primitive(PrimitiveType::Fixed(*n as u64)),
        Binary | LargeBinary | BinaryView => primitive(PrimitiveType::Binary),
        Date32 => primitive(PrimitiveType::Date),
        Time32(_) | Time64(TimeUnit::Microsecond) => primitive(PrimitiveType::Time),
        Time64(_) => refuse("has nanoseconds; Iceberg's time holds microseconds".to_string()),
        Timestamp(TimeUnit::Nanosecond, _) => refuse(
            "has nanoseconds; Iceberg format version 2 timestamps hold microseconds (timestamp_ns needs a format \
             version 3 table: create it, with timestamp_ns columns, before the first run)"
                .to_string(),
        ),
        Timestamp(_, None) => primitive(PrimitiveType::Timestamp),
        Timestamp(_, Some(_)) => primitive(PrimitiveType::Timestamptz),
        List(element) | LargeList(element) | FixedSizeList(element, _) => {
            *ids += 1;
            let id = *ids;
            let ty = iceberg_type(element, ids).map_err(|r| r.under("[]"))?;
            Ok(Type::List(ListType::new(Arc::new(NestedField::list_element(
                id,
                ty,
                !element.is_nullable(),
            )))))
        }
        Struct(children) => {
            let mut fields = Vec::with_capacity(children.len());
            for child in children {
                *ids += 1;
                let id = *ids;
                let ty = iceberg_type(child, ids).map_err(|r| r.under(child.name()))?;
                fields.push(Arc::new(NestedField::new(id, child.name(), ty, !child.is_nullable())));
            }
            Ok(Type::Struct(StructType::new(fields)))
        }
        Map(entries, _) => {
            let DataType::Struct(kv) = entries.data_type() else {
                return refuse("is a map without key and value fields".to_string());
            };
            *ids += 2;
            let (key_id, value_id) = (*ids - 1, *ids);
            let key = iceberg_type(&kv[0], ids).map_err(|r| r.under("{}.key"))?;
            let value = iceberg_type(&kv[1], ids).map_err(|r| r.under("{}"))?;
            Ok(Type::Map(MapType::new(
                Arc::new(NestedField::map_key_element(key_id, key)),
                Arc::new(NestedField::map_value_element(
                    value_id,
                    value,
                    !kv[1].is_nullable(),
                )),
            )))
        }
        other => refuse(format!(
            "has type {}, which no Iceberg type holds exactly",
            describe(other)
        )),
    }
}

/// Every column of `batches` that cannot be written exactly into the table whose Arrow schema (iceberg's, with
/// field ids) is `table`. Columns the table lacks are not refused here (evolution adds them, or the writer refuses
/// them by name).
pub(crate) fn refusals_against(batches: &Schema, table: &Schema) -> Vec<Refusal> {
    batches
        .fields()
        .iter()
        .filter_map(|field| {
            let (_, column) = table.fields().find(field.name())?;
            if uuid_as_text(field) && column.data_type() == &DataType::Utf8 {
                return None;
            }
            exact::check(field.data_type(), column.data_type())
                .err()
                .map(|r| r.under(field.name()))
        })
        .collect()
}

/// The [`Config`](ErrorKind::Config) error of `refusals` for the sink's `table`.
pub(crate) fn refused(sink: &SinkId, table: &str, refusals: &[Refusal]) -> Error {
    Error::new(
        ErrorKind::Config,
        Phase::Setup,
        refusals_message(&format!("Iceberg table {table}"), refusals),
    )
    .with_sink(sink)
}

#[cfg(test)]
mod tests {
    use connector_api::types::marks::marked;

    use super::*;

    #[test]
    fn real_types_get_exact_iceberg_types_and_the_rest_is_refused_by_path() {
        let line = DataType::Struct(
            vec![
                Field::new("sku", DataType::Utf8, false),
                Field::new("qty", DataType::Int32, false),
            ]
            .into(),
        );
        let schema = Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("amount", DataType::Decimal128(18, 4), true),
            Field::new(
                "at",
                DataType::Timestamp(TimeUnit::Millisecond, Some("+00:00".into())),
                true,
            ),
            Field::new(
                "status",
                DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
                true,
            ),
            marked(
                Field::new("ref", DataType::FixedSizeBinary(16), true),
                Mark::Uuid,
            ),
            Field::new(
                "lines",
                DataType::List(Arc::new(Field::new("item", line, true))),
                true,
            ),
            Field::new("at_time", DataType::Time32(TimeUnit::Millisecond), true),
        ]);
        let iceberg = table_schema(&schema).unwrap();
        let ty = |name: &str| iceberg.field_by_name(name).unwrap().field_type.to_string();
        assert_eq!(ty("amount"), "decimal(18, 4)");
        assert_eq!(ty("at"), "timestamptz");
        assert_eq!(ty("status"), "string");
        assert_eq!(ty("ref"), "string", "a UUID is its canonical text");
        assert_eq!(ty("at_time"), "time");
        assert!(iceberg.field_by_name("lines.element.qty").is_some());

        let refused = Schema::new(vec![
            Field::new("big", DataType::UInt64, true),
            Field::new("ns", DataType::Time64(TimeUnit::Nanosecond), true),
            Field::new(
                "deep",
                DataType::Struct(vec![Field::new("d", DataType::Decimal256(50, 2), true)].into()),
                true,
            ),
        ]);
        let paths: Vec<String> = table_schema(&refused)
            .unwrap_err()
            .into_iter()
            .map(|r| r.path)
            .collect();
        assert_eq!(paths, ["big", "ns", "deep.d"]);
    }

    #[test]
    fn an_existing_table_takes_what_converts_exactly() {
        let created = table_schema(&Schema::new(vec![
            Field::new(
                "at",
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
                true,
            ),
            Field::new("qty", DataType::Int32, true),
        ]))
        .unwrap();
        let table = iceberg::arrow::schema_to_arrow_schema(&created).unwrap();
        let batches = Schema::new(vec![
            Field::new(
                "at",
                DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
                true,
            ),
            Field::new("qty", DataType::Int64, true),
        ]);
        let refusals = refusals_against(&batches, &table);
        assert_eq!(refusals.len(), 1);
        assert_eq!(refusals[0].path, "qty");
    }
}
