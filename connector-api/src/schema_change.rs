//! What a schema change may be: the one check every sink's [`TwoPhaseCommit::evolve`](crate::TwoPhaseCommit::evolve)
//! makes before touching its external system.

use std::sync::Arc;

use arrow_schema::{DataType, FieldRef, Schema, SchemaRef};

use crate::{Error, ErrorKind, Evolution, Phase, Result, SinkId};

/// A column whose type a new schema widens ([`widens`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Widened {
    /// The column as it was.
    pub from: FieldRef,
    /// The column as it is now (its nullability may have changed too).
    pub to: FieldRef,
}

/// How a new schema of the batches differs from the one a sink writes: the columns it adds, widens and makes
/// optional. Every column of the old schema is in the new one (in any position: a source's metadata columns stay
/// after its decoded ones); nothing else may change.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SchemaChange {
    /// New columns, nullable (rows written before the change have no value for them), in the new schema's order.
    pub added: Vec<FieldRef>,
    /// Columns whose type is widened, as the new schema has them.
    pub widened: Vec<Widened>,
    /// Columns that were required and are now nullable, as the new schema has them (a widened one among them).
    pub relaxed: Vec<FieldRef>,
}

impl SchemaChange {
    /// Whether nothing changes.
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.widened.is_empty() && self.relaxed.is_empty()
    }

    /// The change from `old` to `new`, whatever a sink's `evolution` allows.
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) naming `sink` and the column that was removed, changed its type other than
    /// by widening it, became required, or is added as required.
    pub fn between(sink: &SinkId, old: &Schema, new: &Schema) -> Result<Self> {
        let refuse = |what: String| {
            Error::new(
                ErrorKind::Config,
                Phase::Setup,
                format!(
                    "sink {sink} cannot take the new schema: {what}; a schema may add nullable columns, widen a \
                     type (int to long, float to double, a decimal's precision up at the same scale) and make a \
                     column optional"
                ),
            )
            .with_sink(sink)
        };
        let mut change = SchemaChange::default();
        for field in old.fields() {
            let Ok(now) = new.field_with_name(field.name()) else {
                return Err(refuse(format!("column {:?} was removed", field.name())));
            };
            if now.data_type() != field.data_type() {
                if !widens(field.data_type(), now.data_type()) {
                    return Err(refuse(format!(
                        "column {:?} changes type from {} to {}",
                        field.name(),
                        field.data_type(),
                        now.data_type()
                    )));
                }
                change.widened.push(Widened {
                    from: field.clone(),
                    to: Arc::new(now.clone()),
                });
            }
            match (field.is_nullable(), now.is_nullable()) {
                (true, false) => {
                    return Err(refuse(format!(
                        "column {:?} was optional and is now required",
                        field.name()
                    )));
                }
                (false, true) => change.relaxed.push(Arc::new(now.clone())),
                _ => {}
            }
        }
        change.added = new
            .fields()
            .iter()
            .filter(|f| old.field_with_name(f.name()).is_err())
            .cloned()
            .collect();
        if let Some(required) = change.added.iter().find(|f| !f.is_nullable()) {
            return Err(refuse(format!(
                "the added column {:?} is not nullable",
                required.name()
            )));
        }
        Ok(change)
    }

    /// The change from `old` to `new` that a sink with `evolution` makes, as [`between`](Self::between) finds it.
    ///
    /// # Errors
    /// As [`between`](Self::between); and [`Config`](ErrorKind::Config) naming `sink`, the columns and the setting
    /// that would take them when `evolution` does not (`target` says what lacks them: "table orders").
    pub fn to_make(
        sink: &SinkId,
        evolution: Evolution,
        target: &str,
        old: &Schema,
        new: &Schema,
    ) -> Result<Self> {
        let change = Self::between(sink, old, new)?;
        let refuse = |message: String| {
            Err(Error::new(ErrorKind::Config, Phase::Setup, message).with_sink(sink))
        };
        if !change.added.is_empty() && !evolution.adds_columns() {
            let names: Vec<&str> = change.added.iter().map(|f| f.name().as_str()).collect();
            return refuse(format!(
                "the batches gained the column(s) {} that {target} lacks: set evolution = \"add-columns\" (or \
                 \"evolve\") on this sink to add them",
                names.join(", ")
            ));
        }
        if !evolution.changes_columns() {
            if let Some(widened) = change.widened.first() {
                return refuse(format!(
                    "the batches widen column {:?} of {target} from {} to {}: set evolution = \"evolve\" on this \
                     sink to widen it",
                    widened.to.name(),
                    widened.from.data_type(),
                    widened.to.data_type()
                ));
            }
            if let Some(relaxed) = change.relaxed.first() {
                return refuse(format!(
                    "the batches make column {:?} of {target} optional (it was required): set evolution = \
                     \"evolve\" on this sink to let it take nulls",
                    relaxed.name()
                ));
            }
        }
        Ok(change)
    }
}

/// Whether values of type `from` read as type `to` without any change (the widenings Avro, Protobuf, Iceberg and
/// SQL databases share): a signed integer to a wider one, a float to a wider one, a decimal to a greater
/// precision at the same scale; and, nested, a struct that gains nullable fields or whose fields widen or become
/// nullable, a list or map whose items do.
pub fn widens(from: &DataType, to: &DataType) -> bool {
    use DataType::*;
    let int_width = |t: &DataType| match t {
        Int8 => Some(1),
        Int16 => Some(2),
        Int32 => Some(4),
        Int64 => Some(8),
        _ => None,
    };
    let float_width = |t: &DataType| match t {
        Float16 => Some(2),
        Float32 => Some(4),
        Float64 => Some(8),
        _ => None,
    };
    let decimal = |t: &DataType| match t {
        Decimal32(p, s) | Decimal64(p, s) | Decimal128(p, s) | Decimal256(p, s) => Some((*p, *s)),
        _ => None,
    };
    if let (Some(a), Some(b)) = (int_width(from), int_width(to)) {
        return a < b;
    }
    if let (Some(a), Some(b)) = (float_width(from), float_width(to)) {
        return a < b;
    }
    if let (Some((p1, s1)), Some((p2, s2))) = (decimal(from), decimal(to)) {
        return s1 == s2 && p1 < p2;
    }
    // A nested field keeps its values when its type is the same or widened and it does not become required.
    let keeps = |a: &arrow_schema::Field, b: &arrow_schema::Field| {
        (a.data_type() == b.data_type() || widens(a.data_type(), b.data_type()))
            && (b.is_nullable() || !a.is_nullable())
    };
    match (from, to) {
        (Struct(old), Struct(new)) => {
            from != to
                && old.iter().all(|a| {
                    new.iter()
                        .find(|b| b.name() == a.name())
                        .is_some_and(|b| keeps(a, b))
                })
                && new
                    .iter()
                    .filter(|b| !old.iter().any(|a| a.name() == b.name()))
                    .all(|b| b.is_nullable())
        }
        (List(a), List(b)) | (LargeList(a), LargeList(b)) => from != to && keeps(a, b),
        (Map(a, sorted_a), Map(b, sorted_b)) => sorted_a == sorted_b && from != to && keeps(a, b),
        _ => false,
    }
}

/// The schema of a sink that writes whatever columns a batch has (the Kafka sink's JSON records): there is nothing
/// in its external system to change, only whether its `evolution` lets new columns through.
#[derive(Debug, Clone, Default)]
pub struct FollowedSchema {
    schema: Option<SchemaRef>,
    evolution: Evolution,
}

impl FollowedSchema {
    /// Batches of `schema` (`None`: not known), new columns allowed as `evolution` says.
    pub fn new(schema: Option<SchemaRef>, evolution: Evolution) -> Self {
        Self { schema, evolution }
    }

    /// Takes `new` ([`TwoPhaseCommit::evolve`](crate::TwoPhaseCommit::evolve) of such a sink); `target` names what
    /// would receive the new columns ("topic orders").
    ///
    /// # Errors
    /// As [`SchemaChange::to_make`].
    pub fn evolve(&mut self, sink: &SinkId, target: &str, new: SchemaRef) -> Result<()> {
        let old = self
            .schema
            .clone()
            .unwrap_or_else(|| Arc::new(Schema::empty()));
        SchemaChange::to_make(sink, self.evolution, target, &old, &new)?;
        self.schema = Some(new);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use arrow_schema::{DataType, Field};

    use super::*;

    fn schema(fields: &[(&str, DataType, bool)]) -> Schema {
        Schema::new(
            fields
                .iter()
                .map(|(name, ty, nullable)| Field::new(*name, ty.clone(), *nullable))
                .collect::<Vec<_>>(),
        )
    }

    #[test]
    fn only_nullable_columns_may_be_added() {
        let sink = SinkId::new("s").unwrap();
        let old = schema(&[
            ("id", DataType::Int64, false),
            ("offset", DataType::Int64, false),
        ]);
        let new = schema(&[
            ("id", DataType::Int64, false),
            ("qty", DataType::Int32, true),
            ("offset", DataType::Int64, false),
        ]);
        let change = SchemaChange::between(&sink, &old, &new).unwrap();
        assert_eq!(change.added.len(), 1);
        assert_eq!(change.added[0].name(), "qty");
        assert!(change.widened.is_empty() && change.relaxed.is_empty());
        for (new, expected) in [
            (
                schema(&[("id", DataType::Int64, false)]),
                "\"offset\" was removed",
            ),
            (
                schema(&[
                    ("id", DataType::Int32, false),
                    ("offset", DataType::Int64, false),
                ]),
                "changes type",
            ),
            (
                schema(&[
                    ("id", DataType::Utf8, false),
                    ("offset", DataType::Int64, false),
                ]),
                "changes type",
            ),
            (
                schema(&[
                    ("id", DataType::Int64, false),
                    ("offset", DataType::Int64, false),
                    ("qty", DataType::Int32, false),
                ]),
                "\"qty\" is not nullable",
            ),
        ] {
            let err = SchemaChange::between(&sink, &old, &new).unwrap_err();
            assert!(err.to_string().contains(expected), "{err}");
        }
    }

    #[test]
    fn widened_and_relaxed_columns_need_evolve() {
        let sink = SinkId::new("s").unwrap();
        let old = schema(&[
            ("id", DataType::Int32, false),
            ("price", DataType::Decimal128(9, 2), true),
            ("ratio", DataType::Float32, true),
            ("note", DataType::Utf8, false),
        ]);
        let new = schema(&[
            ("id", DataType::Int64, false),
            ("price", DataType::Decimal128(12, 2), true),
            ("ratio", DataType::Float64, true),
            ("note", DataType::Utf8, true),
        ]);
        let change =
            SchemaChange::to_make(&sink, Evolution::Evolve, "table t", &old, &new).unwrap();
        let widened: Vec<&str> = change
            .widened
            .iter()
            .map(|w| w.to.name().as_str())
            .collect();
        assert_eq!(widened, ["id", "price", "ratio"]);
        assert_eq!(change.relaxed.len(), 1);
        assert_eq!(change.relaxed[0].name(), "note");
        let err = SchemaChange::to_make(&sink, Evolution::AddColumns, "table t", &old, &new)
            .unwrap_err()
            .to_string();
        assert!(err.contains("\"id\"") && err.contains("evolve"), "{err}");
        let optional = schema(&[
            ("id", DataType::Int32, false),
            ("price", DataType::Decimal128(9, 2), true),
            ("ratio", DataType::Float32, true),
            ("note", DataType::Utf8, true),
        ]);
        let err = SchemaChange::to_make(&sink, Evolution::None, "table t", &old, &optional)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("\"note\"") && err.contains("optional"),
            "{err}"
        );
        let required = schema(&[
            ("id", DataType::Int32, false),
            ("price", DataType::Decimal128(9, 2), false),
            ("ratio", DataType::Float32, true),
            ("note", DataType::Utf8, false),
        ]);
        let err = SchemaChange::between(&sink, &old, &required)
            .unwrap_err()
            .to_string();
        assert!(err.contains("now required"), "{err}");
    }

    #[test]
    fn only_lossless_widenings_widen() {
        use DataType::*;
        assert!(widens(&Int32, &Int64) && widens(&Int8, &Int32) && widens(&Float32, &Float64));
        assert!(widens(&Decimal128(9, 2), &Decimal128(20, 2)));
        assert!(widens(&Decimal64(9, 2), &Decimal128(20, 2)));
        for (from, to) in [
            (Int64, Int32),
            (Int32, Float64),
            (Int64, Float64),
            (UInt32, Int64),
            (Float64, Float32),
            (Decimal128(9, 2), Decimal128(12, 3)),
            (Decimal128(12, 2), Decimal128(9, 2)),
            (Int32, Decimal128(20, 0)),
        ] {
            assert!(!widens(&from, &to), "{from} to {to}");
        }
    }

    #[test]
    fn a_nested_struct_widens_by_nullable_fields_and_widened_ones() {
        use DataType::*;
        let customer = |fields: Vec<Field>| Struct(fields.into());
        let old = customer(vec![
            Field::new("name", Utf8, false),
            Field::new("age", Int32, true),
        ]);
        let added = customer(vec![
            Field::new("name", Utf8, false),
            Field::new("age", Int32, true),
            Field::new("email", Utf8, true),
        ]);
        assert!(widens(&old, &added));
        let wider = customer(vec![
            Field::new("name", Utf8, true),
            Field::new("age", Int64, true),
        ]);
        assert!(widens(&old, &wider));
        let items = |item: DataType| List(Arc::new(Field::new("item", item, true)));
        assert!(widens(&items(old.clone()), &items(added.clone())));
        assert!(!widens(&old, &old));
        for refused in [
            customer(vec![Field::new("name", Utf8, false)]),
            customer(vec![
                Field::new("name", Utf8, false),
                Field::new("age", Int32, false),
            ]),
            customer(vec![
                Field::new("name", Utf8, false),
                Field::new("age", Int32, true),
                Field::new("email", Utf8, false),
            ]),
            customer(vec![
                Field::new("name", Int64, false),
                Field::new("age", Int32, true),
            ]),
        ] {
            assert!(!widens(&old, &refused), "{refused}");
        }
    }
}
