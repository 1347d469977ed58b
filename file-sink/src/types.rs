//! The file sink's half of the type contract (docs/types.md): which columns each format holds exactly, checked at
//! start, by `check-config` and when the schema evolves.
//!
//! - **Parquet**: every Arrow type as Parquet's own (decimals, timestamps in their unit with
//!   `isAdjustedToUTC` for instants, times, dates, fixed-size binary, dictionaries, lists, structs, maps), the Arrow
//!   schema embedded so Arrow readers get the exact types back. Refused: unions (the Parquet writer has no form for
//!   them) and `Interval(MonthDayNano)` (it cannot write them).
//! - **JSON lines**: [`connector_api::types::json`], as the Kafka sink's JSON values.
//! - **CSV**: flat columns only (nested fields and unions refused); decimals exact, binary as hex, timestamps in RFC
//!   3339.

use arrow_schema::{DataType, IntervalUnit, Schema};
use connector_api::types::{Refusal, describe, json};
use connector_api::{Error, ErrorKind, Phase, Result, SinkId};

use crate::config::FormatConfig;

/// Every field of `schema` that `format` cannot hold exactly.
pub(crate) fn refusals(format: &FormatConfig, schema: &Schema) -> Vec<Refusal> {
    match format {
        FormatConfig::JsonLines => json::check(schema).err().into_iter().collect(),
        FormatConfig::Parquet { .. } => schema
            .fields()
            .iter()
            .filter_map(|f| parquet_refusal(f.data_type()).err().map(|r| r.under(f.name())))
            .collect(),
        FormatConfig::Csv => schema
            .fields()
            .iter()
            .filter(|f| f.data_type().is_nested() || matches!(f.data_type(), DataType::Union(..)))
            .map(|f| {
                Refusal::new(
                    f.name().as_str(),
                    format!(
                        "has type {}, which a CSV cell cannot hold; use format json_lines or parquet",
                        describe(f.data_type())
                    ),
                )
            })
            .collect(),
    }
}

fn parquet_refusal(ty: &DataType) -> std::result::Result<(), Refusal> {
    connector_api::types::refuse_nested(ty, &|t| {
        let why = match t {
            DataType::Union(..) => "which Parquet has no form for",
            DataType::Interval(IntervalUnit::MonthDayNano) => {
                "which the Parquet writer cannot write"
            }
            _ => return None,
        };
        Some(Refusal::new("", format!("has type {}, {why}", describe(t))))
    })
}

/// Refuses a format that cannot hold the schema exactly.
///
/// # Errors
/// [`Config`](ErrorKind::Config) naming every field.
pub(crate) fn check(format: &FormatConfig, schema: &Schema, sink: &SinkId) -> Result<()> {
    let refusals = refusals(format, schema);
    match refusals.is_empty() {
        true => Ok(()),
        false => Err(Error::new(
            ErrorKind::Config,
            Phase::Setup,
            connector_api::types::refusals_message(
                &format!("the file sink's {} files", format.extension()),
                &refusals,
            ),
        )
        .with_sink(sink)),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_schema::{Field, UnionFields, UnionMode};

    use super::*;

    #[test]
    fn each_format_refuses_what_it_cannot_hold() {
        let union = DataType::Union(
            UnionFields::try_new(
                vec![0, 1],
                vec![
                    Field::new("a", DataType::Int32, true),
                    Field::new("b", DataType::Utf8, true),
                ],
            )
            .unwrap(),
            UnionMode::Dense,
        );
        let schema = Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new(
                "lines",
                DataType::List(Arc::new(Field::new("item", union, true))),
                true,
            ),
        ]);
        let parquet = refusals(&FormatConfig::default(), &schema);
        assert_eq!(parquet.len(), 1);
        assert_eq!(parquet[0].path, "lines[]");
        assert_eq!(refusals(&FormatConfig::Csv, &schema)[0].path, "lines");
        assert_eq!(
            refusals(&FormatConfig::JsonLines, &schema)[0].path,
            "lines[]"
        );
    }
}
