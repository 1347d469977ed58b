//! The layout of a table the sink creates (`create_table`): its partition spec (`partition_by`), sort order
//! (`sort_by`) and table properties (`properties`), from the job file, checked against the table's schema before
//! anything is created. A table that exists already keeps its own layout: these keys only shape a new one.
//!
//! Terms are written as Spark SQL writes them: a column (`region`, or `customer.country` inside a struct), or a
//! transform of one: `identity(c)`, `year(c)`, `month(c)`, `day(c)`, `hour(c)`, `bucket(N, c)`,
//! `truncate(W, c)`. Partition fields are named as Spark names them (`c` for identity, `c_year`, `c_month`,
//! `c_day`, `c_hour`, `c_bucket`, `c_trunc`). A sort term may end in `asc` or `desc` and `nulls first` or
//! `nulls last` (defaults: ascending; nulls first when ascending, last when descending, as in Spark).
//!
//! The sort order is recorded on the table for the engines that rewrite or compact it; the sink itself writes each
//! checkpoint's rows in the order they came (its data files carry no sort order id).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use connector_api::{Error, ErrorKind, Phase, Result, SinkId};
use iceberg::spec::{
    FormatVersion, NullOrder, PartitionSpec, Schema, SortDirection, SortField, SortOrder,
    TableProperties, Transform, UnboundPartitionSpec,
};

use crate::ledger::JOB_PROPERTY;

/// What the job file says a created table looks like.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TableLayout {
    /// Partition terms (`day(created)`, `bucket(16, id)`); empty: unpartitioned.
    pub partition_by: Vec<String>,
    /// Sort terms (`id`, `created desc nulls last`); empty: unsorted.
    pub sort_by: Vec<String>,
    /// Table properties, set over the sink's own defaults for created tables.
    pub properties: BTreeMap<String, String>,
    /// The Iceberg format version of a created table: 2 or 3 (`None`: 2). Version 3 upserts write deletion
    /// vectors (`deletion_vectors.rs`) and its rows carry row lineage.
    pub format_version: Option<u8>,
}

/// A layout checked against a schema: what the table is created with.
#[derive(Debug)]
pub(crate) struct BoundLayout {
    pub(crate) partition_spec: UnboundPartitionSpec,
    pub(crate) sort_order: SortOrder,
    /// The job file's properties only (the sink's defaults are added where the table is created).
    pub(crate) properties: HashMap<String, String>,
    pub(crate) format_version: FormatVersion,
}

impl TableLayout {
    /// Whether the job file shapes the table at all.
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// Refuses a layout the sink could not honour: one on a sink that never creates its table (`create_table =
    /// false`), and a partitioned upsert table (an equality delete of a key reaches only the rows of its own
    /// partition, so a key whose row moves partition would keep its old row).
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) naming the sink and what to change.
    pub(crate) fn check_settings(
        &self,
        sink: &SinkId,
        create_table: bool,
        upsert_key: &[String],
        upsert_deletes: crate::UpsertDeletes,
    ) -> Result<()> {
        let refuse = |why: &str| {
            Err(Error::new(ErrorKind::Config, Phase::Setup, why.to_string()).with_sink(sink))
        };
        if !create_table && !self.is_default() {
            return refuse(
                "partition_by, sort_by, properties and format_version shape a table the sink creates, and \
                 create_table is false: set create_table = true, or change the existing table's layout with its \
                 own engine (Spark's ALTER TABLE)",
            );
        }
        if !upsert_key.is_empty()
            && !self.partition_by.is_empty()
            && upsert_deletes == crate::UpsertDeletes::Equality
        {
            return refuse(
                "partition_by with upsert_key and upsert_deletes = \"equality\": equality deletes reach only the \
                 rows of their own partition, so a key whose row changes partition would keep its old row; \
                 delete by position (upsert_deletes = \"position\", the default), whose key index knows each \
                 row's partition, or leave the upsert table unpartitioned",
            );
        }
        Ok(())
    }

    /// Checks the layout against `schema`, the columns the table would be created with.
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) naming the sink, the key and the term: a column the schema lacks, a transform
    /// its type does not take (`day` of a string), a malformed term, the same partition field twice, a property
    /// the sink keeps for itself (`ratchet.*`), or a format version other than 2 and 3.
    pub(crate) fn bind(&self, sink: &SinkId, schema: &Schema) -> Result<BoundLayout> {
        let format_version = match self.format_version {
            None | Some(2) => FormatVersion::V2,
            Some(3) => FormatVersion::V3,
            Some(other) => {
                return Err(Error::new(
                    ErrorKind::Config,
                    Phase::Setup,
                    format!(
                        "format_version = {other}: the sink creates Iceberg format-version 2 tables (the default) \
                         or 3 (deletion vectors for upserts, row lineage); version 1 has no delete files"
                    ),
                )
                .with_sink(sink));
            }
        };
        let refuse = |key: &str, term: &str, why: String| {
            Error::new(
                ErrorKind::Config,
                Phase::Setup,
                format!("{key} term {term:?}: {why}"),
            )
            .with_sink(sink)
        };
        let mut spec = UnboundPartitionSpec::builder();
        for text in &self.partition_by {
            let term = Term::parse(text).map_err(|why| refuse("partition_by", text, why))?;
            let source = term
                .source_id(schema)
                .map_err(|why| refuse("partition_by", text, why))?;
            spec = spec
                .add_partition_field(source, term.partition_name(), term.transform)
                .map_err(|e| refuse("partition_by", text, e.message().to_string()))?;
        }
        let spec = spec.build();
        // Bound once to check every transform against its column's type; created unbound (the catalog assigns ids).
        PartitionSpec::builder(Arc::new(schema.clone()))
            .add_unbound_fields(spec.fields().iter().cloned())
            .and_then(|builder| builder.build())
            .map_err(|e| {
                refuse(
                    "partition_by",
                    &self.partition_by.join(", "),
                    e.message().to_string(),
                )
            })?;
        let mut order = SortOrder::builder();
        for text in &self.sort_by {
            let (term, direction, nulls) =
                sort_term(text).map_err(|why| refuse("sort_by", text, why))?;
            let source = term
                .source_id(schema)
                .map_err(|why| refuse("sort_by", text, why))?;
            let field_type = schema
                .field_by_id(source)
                .map(|f| f.field_type.as_ref().clone())
                .expect("found by name above");
            term.transform
                .result_type(&field_type)
                .map_err(|e| refuse("sort_by", text, e.message().to_string()))?;
            order.with_sort_field(SortField {
                source_id: source,
                transform: term.transform,
                direction,
                null_order: nulls,
            });
        }
        let sort_order = order
            .build_unbound()
            .map_err(|e| refuse("sort_by", &self.sort_by.join(", "), e.message().to_string()))?;
        if let Some(key) = self
            .properties
            .keys()
            .find(|key| TableProperties::RESERVED_PROPERTIES.contains(&key.as_str()))
        {
            return Err(Error::new(
                ErrorKind::Config,
                Phase::Setup,
                format!(
                    "properties key {key:?} is reserved by Iceberg (it describes the table's metadata, and no \
                     catalog stores it as a property); leave it out (the format version of a table the sink \
                     creates is `format_version`: 2, the default, or 3)"
                ),
            )
            .with_sink(sink));
        }
        let prefix = JOB_PROPERTY.split('.').next().unwrap_or("ratchet");
        if let Some(key) = self
            .properties
            .keys()
            .find(|key| key.starts_with(&format!("{prefix}.")))
        {
            return Err(Error::new(
                ErrorKind::Config,
                Phase::Setup,
                format!(
                    "properties key {key:?}: the `{prefix}.` properties are the sink's own (its ledger of \
                     commits); choose another name"
                ),
            )
            .with_sink(sink));
        }
        Ok(BoundLayout {
            format_version,
            partition_spec: spec,
            sort_order,
            properties: self
                .properties
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        })
    }
}

/// One term: a transform of a column.
#[derive(Debug, Clone, PartialEq)]
struct Term {
    transform: Transform,
    column: String,
}

impl Term {
    /// Parses `column` or `transform(column)` / `bucket(N, column)` / `truncate(W, column)`.
    fn parse(text: &str) -> std::result::Result<Self, String> {
        let text = text.trim();
        let Some((name, rest)) = text.split_once('(') else {
            return Self::column(Transform::Identity, text);
        };
        let arguments = rest
            .strip_suffix(')')
            .ok_or("lacks its closing `)`")?
            .split(',')
            .map(str::trim)
            .collect::<Vec<_>>();
        let name = name.trim().to_ascii_lowercase();
        let transform = match (name.as_str(), arguments.as_slice()) {
            ("identity", [_]) => Transform::Identity,
            ("year" | "years", [_]) => Transform::Year,
            ("month" | "months", [_]) => Transform::Month,
            ("day" | "days", [_]) => Transform::Day,
            ("hour" | "hours", [_]) => Transform::Hour,
            ("bucket", [n, _]) => Transform::Bucket(count(n)?),
            ("truncate", [w, _]) => Transform::Truncate(count(w)?),
            ("bucket" | "truncate", _) => {
                return Err(format!(
                    "{name} takes a number and a column: `{name}(16, id)`"
                ));
            }
            (_, [_]) => {
                return Err(format!(
                    "unknown transform `{name}` (identity, year, month, day, hour, bucket, truncate)"
                ));
            }
            _ => return Err(format!("`{name}` takes one column")),
        };
        Self::column(transform, arguments.last().expect("split yields one"))
    }

    fn column(transform: Transform, column: &str) -> std::result::Result<Self, String> {
        let column = column.trim();
        let valid = !column.is_empty()
            && column
                .chars()
                .all(|c| c.is_alphanumeric() || c == '_' || c == '.');
        match valid {
            true => Ok(Self {
                transform,
                column: column.to_string(),
            }),
            false => Err(format!("{column:?} is not a column name")),
        }
    }

    /// The field id of the term's column in `schema`.
    fn source_id(&self, schema: &Schema) -> std::result::Result<i32, String> {
        schema
            .field_by_name(&self.column)
            .map(|field| field.id)
            .ok_or_else(|| format!("the table has no column `{}`", self.column))
    }

    /// The partition field's name, as Spark names it.
    fn partition_name(&self) -> String {
        let column = self.column.replace('.', "_");
        match self.transform {
            Transform::Identity => column,
            Transform::Year => format!("{column}_year"),
            Transform::Month => format!("{column}_month"),
            Transform::Day => format!("{column}_day"),
            Transform::Hour => format!("{column}_hour"),
            Transform::Bucket(_) => format!("{column}_bucket"),
            Transform::Truncate(_) => format!("{column}_trunc"),
            _ => format!("{column}_{}", self.transform),
        }
    }
}

/// A bucket count or truncation width: a positive integer.
fn count(text: &str) -> std::result::Result<u32, String> {
    text.parse::<u32>()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("{text:?} is not a positive whole number"))
}

/// A sort term: the term, then optional `asc` / `desc` and `nulls first` / `nulls last`.
fn sort_term(text: &str) -> std::result::Result<(Term, SortDirection, NullOrder), String> {
    let lower = text.trim().to_ascii_lowercase();
    let (rest, nulls) = match lower
        .strip_suffix("nulls first")
        .map(|r| (r, Some(NullOrder::First)))
        .or_else(|| {
            lower
                .strip_suffix("nulls last")
                .map(|r| (r, Some(NullOrder::Last)))
        }) {
        Some(found) => found,
        None => (lower.as_str(), None),
    };
    let rest = rest.trim_end();
    let (rest, direction) = match rest
        .strip_suffix(" desc")
        .map(|r| (r, SortDirection::Descending))
        .or_else(|| {
            rest.strip_suffix(" asc")
                .map(|r| (r, SortDirection::Ascending))
        }) {
        Some(found) => found,
        None => (rest, SortDirection::Ascending),
    };
    let nulls = nulls.unwrap_or(match direction {
        SortDirection::Ascending => NullOrder::First,
        SortDirection::Descending => NullOrder::Last,
    });
    // The column keeps the case it was written in.
    let term = Term::parse(&text.trim()[..rest.len()])?;
    Ok((term, direction, nulls))
}

#[cfg(test)]
mod tests {
    use iceberg::spec::{NestedField, PrimitiveType, Type};

    use super::*;

    fn schema() -> Schema {
        Schema::builder()
            .with_fields(vec![
                NestedField::required(1, "id", Type::Primitive(PrimitiveType::Long)).into(),
                NestedField::optional(2, "Region", Type::Primitive(PrimitiveType::String)).into(),
                NestedField::optional(3, "created", Type::Primitive(PrimitiveType::Timestamptz))
                    .into(),
            ])
            .build()
            .unwrap()
    }

    fn sink() -> SinkId {
        SinkId::new("lake").unwrap()
    }

    #[test]
    fn terms_become_the_spec_sort_order_and_properties_spark_would_make() {
        let layout = TableLayout {
            partition_by: vec![
                "day(created)".into(),
                "bucket(16, id)".into(),
                "Region".into(),
            ],
            sort_by: vec![
                "created DESC".into(),
                "truncate(4, Region) asc nulls last".into(),
            ],
            properties: BTreeMap::from([("write.parquet.compression-codec".into(), "zstd".into())]),
            format_version: None,
        };
        let bound = layout.bind(&sink(), &schema()).unwrap();
        let fields: Vec<(i32, &str, Transform)> = bound
            .partition_spec
            .fields()
            .iter()
            .map(|f| (f.source_id, f.name.as_str(), f.transform))
            .collect();
        assert_eq!(
            fields,
            [
                (3, "created_day", Transform::Day),
                (1, "id_bucket", Transform::Bucket(16)),
                (2, "Region", Transform::Identity),
            ]
        );
        let sorted: Vec<(i32, Transform, SortDirection, NullOrder)> = bound
            .sort_order
            .fields
            .iter()
            .map(|f| (f.source_id, f.transform, f.direction, f.null_order))
            .collect();
        assert_eq!(
            sorted,
            [
                (
                    3,
                    Transform::Identity,
                    SortDirection::Descending,
                    NullOrder::Last
                ),
                (
                    2,
                    Transform::Truncate(4),
                    SortDirection::Ascending,
                    NullOrder::Last
                ),
            ]
        );
        assert_eq!(bound.sort_order.order_id, 1);
        assert_eq!(bound.properties["write.parquet.compression-codec"], "zstd");
        let plain = TableLayout::default().bind(&sink(), &schema()).unwrap();
        assert!(plain.partition_spec.fields().is_empty() && plain.sort_order.is_unsorted());
    }

    #[test]
    fn a_layout_is_refused_where_the_sink_creates_no_table_or_upserts_by_equality() {
        use crate::UpsertDeletes;
        let partitioned = TableLayout {
            partition_by: vec!["day(created)".into()],
            ..TableLayout::default()
        };
        let (position, equality) = (UpsertDeletes::Position, UpsertDeletes::Equality);
        let err = partitioned
            .check_settings(&sink(), false, &[], position)
            .unwrap_err()
            .to_string();
        assert!(err.contains("create_table = true"), "{err}");
        let err = partitioned
            .check_settings(&sink(), true, &["id".into()], equality)
            .unwrap_err()
            .to_string();
        assert!(err.contains("partition_by with upsert_key"), "{err}");
        partitioned
            .check_settings(&sink(), true, &["id".into()], position)
            .unwrap();
        partitioned
            .check_settings(&sink(), true, &[], equality)
            .unwrap();
        let sorted = TableLayout {
            sort_by: vec!["id".into()],
            ..TableLayout::default()
        };
        sorted
            .check_settings(&sink(), true, &["id".into()], equality)
            .unwrap();
        TableLayout::default()
            .check_settings(&sink(), false, &["id".into()], equality)
            .unwrap();
    }

    #[test]
    fn terms_that_cannot_shape_the_table_are_refused_naming_the_key_and_term() {
        let cases: [(&str, &str, &str); 8] = [
            ("partition_by", "day(Region)", "Region"),
            ("partition_by", "day(nothing)", "no column `nothing`"),
            ("partition_by", "bucket(id)", "takes a number and a column"),
            (
                "partition_by",
                "bucket(0, id)",
                "not a positive whole number",
            ),
            ("partition_by", "week(created)", "unknown transform `week`"),
            ("partition_by", "day(created", "closing"),
            ("sort_by", "hour(id) desc", "hour"),
            ("sort_by", "id sideways", "not a column name"),
        ];
        for (key, term, said) in cases {
            let layout = match key {
                "partition_by" => TableLayout {
                    partition_by: vec![term.into()],
                    ..TableLayout::default()
                },
                _ => TableLayout {
                    sort_by: vec![term.into()],
                    ..TableLayout::default()
                },
            };
            let err = layout.bind(&sink(), &schema()).unwrap_err();
            let text = err.to_string();
            assert_eq!(err.kind(), ErrorKind::Config, "{text}");
            assert!(
                text.contains("sink lake") && text.contains(key) && text.contains(said),
                "{term}: {text}"
            );
        }
        let twice = TableLayout {
            partition_by: vec!["day(created)".into(), "day(created)".into()],
            ..TableLayout::default()
        };
        assert!(twice.bind(&sink(), &schema()).is_err());
        let own = TableLayout {
            properties: BTreeMap::from([("ratchet.epoch".into(), "9".into())]),
            ..TableLayout::default()
        };
        let err = own.bind(&sink(), &schema()).unwrap_err().to_string();
        assert!(
            err.contains("ratchet.epoch") && err.contains("sink's own"),
            "{err}"
        );
        let reserved = TableLayout {
            properties: BTreeMap::from([("format-version".into(), "3".into())]),
            ..TableLayout::default()
        };
        let err = reserved.bind(&sink(), &schema()).unwrap_err().to_string();
        assert!(
            err.contains("format-version") && err.contains("reserved"),
            "{err}"
        );
    }

    #[test]
    fn a_created_table_is_format_version_2_or_3_as_the_job_file_says() {
        let version = |format_version| {
            TableLayout {
                format_version,
                ..TableLayout::default()
            }
            .bind(&sink(), &schema())
            .map(|bound| bound.format_version)
        };
        assert_eq!(version(None).unwrap(), FormatVersion::V2);
        assert_eq!(version(Some(2)).unwrap(), FormatVersion::V2);
        assert_eq!(version(Some(3)).unwrap(), FormatVersion::V3);
        for refused in [1, 4] {
            let err = version(Some(refused)).unwrap_err().to_string();
            assert!(
                err.contains(&format!("format_version = {refused}")),
                "{err}"
            );
        }
        let err = TableLayout {
            format_version: Some(3),
            ..TableLayout::default()
        }
        .check_settings(&sink(), false, &[], crate::UpsertDeletes::Position)
        .unwrap_err()
        .to_string();
        assert!(err.contains("create_table = true"), "{err}");
    }
}
