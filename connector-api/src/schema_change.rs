//! What a schema change may be: the one check every sink's [`TwoPhaseCommit::evolve`](crate::TwoPhaseCommit::evolve)
//! makes before touching its external system.

use std::sync::Arc;

use arrow_schema::{FieldRef, Schema, SchemaRef};

use crate::{Error, ErrorKind, Evolution, Phase, Result, SinkId};

/// The columns `new` adds to `old`: every column of `old` must be in `new` with the same type (in any position:
/// a source's metadata columns stay after its decoded ones), and every added column must be nullable (rows
/// written before the change have no value for it).
///
/// # Errors
/// [`Config`](ErrorKind::Config) naming `sink` and the column that was removed, changed type or is added as
/// required.
pub fn added_columns(sink: &SinkId, old: &Schema, new: &Schema) -> Result<Vec<FieldRef>> {
    let refuse = |what: String| {
        Error::new(
            ErrorKind::Config,
            Phase::Setup,
            format!(
                "sink {sink} cannot take the new schema: {what}; only nullable columns can be added"
            ),
        )
        .with_sink(sink)
    };
    for field in old.fields() {
        match new.field_with_name(field.name()) {
            Err(_) => return Err(refuse(format!("column {:?} was removed", field.name()))),
            Ok(now) if now.data_type() != field.data_type() => {
                return Err(refuse(format!(
                    "column {:?} changes type from {} to {}",
                    field.name(),
                    field.data_type(),
                    now.data_type()
                )));
            }
            Ok(_) => {}
        }
    }
    let added: Vec<FieldRef> = new
        .fields()
        .iter()
        .filter(|f| old.field_with_name(f.name()).is_err())
        .cloned()
        .collect();
    if let Some(required) = added.iter().find(|f| !f.is_nullable()) {
        return Err(refuse(format!(
            "the added column {:?} is not nullable",
            required.name()
        )));
    }
    Ok(added)
}

/// The columns `new` adds to `old` that a sink with `evolution` takes, as [`added_columns`] finds them.
///
/// # Errors
/// As [`added_columns`]; and [`Config`](ErrorKind::Config) naming `sink`, the columns and the setting when some
/// are added and `evolution` is [`None`](Evolution::None) (`target` says what lacks them: "table orders").
pub fn columns_to_add(
    sink: &SinkId,
    evolution: Evolution,
    target: &str,
    old: &Schema,
    new: &Schema,
) -> Result<Vec<FieldRef>> {
    let added = added_columns(sink, old, new)?;
    if !added.is_empty() && evolution != Evolution::AddColumns {
        let names: Vec<&str> = added.iter().map(|f| f.name().as_str()).collect();
        return Err(Error::new(
            ErrorKind::Config,
            Phase::Setup,
            format!(
                "the batches gained the column(s) {} that {target} lacks: set evolution = \"add-columns\" on this \
                 sink to add them",
                names.join(", ")
            ),
        )
        .with_sink(sink));
    }
    Ok(added)
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
    /// As [`columns_to_add`].
    pub fn evolve(&mut self, sink: &SinkId, target: &str, new: SchemaRef) -> Result<()> {
        let old = self
            .schema
            .clone()
            .unwrap_or_else(|| Arc::new(Schema::empty()));
        columns_to_add(sink, self.evolution, target, &old, &new)?;
        self.schema = Some(new);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use arrow_schema::{DataType, Field};

    use super::*;

    #[test]
    fn only_nullable_columns_may_be_added() {
        let sink = SinkId::new("s").unwrap();
        let old = Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("offset", DataType::Int64, false),
        ]);
        let new = Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("qty", DataType::Int32, true),
            Field::new("offset", DataType::Int64, false),
        ]);
        let added = added_columns(&sink, &old, &new).unwrap();
        assert_eq!(added.len(), 1);
        assert_eq!(added[0].name(), "qty");
        for (new, expected) in [
            (
                Schema::new(vec![Field::new("id", DataType::Int64, false)]),
                "\"offset\" was removed",
            ),
            (
                Schema::new(vec![
                    Field::new("id", DataType::Int32, false),
                    Field::new("offset", DataType::Int64, false),
                ]),
                "changes type",
            ),
            (
                Schema::new(vec![
                    Field::new("id", DataType::Int64, false),
                    Field::new("offset", DataType::Int64, false),
                    Field::new("qty", DataType::Int32, false),
                ]),
                "\"qty\" is not nullable",
            ),
        ] {
            let err = added_columns(&sink, &old, &new).unwrap_err();
            assert!(err.to_string().contains(expected), "{err}");
        }
    }
}
