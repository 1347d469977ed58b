//! The job's transforms (`[[transforms]]`) and each sink's `select`: SQL over every batch before the sinks
//! ([`transform`]). Planned once per process against the source's schema (again when it evolves); each sink is
//! built for the schema of what it receives.
//!
//! A batch goes through the chain once; a sink with a `select` gets the select of the chain's output. A row an
//! expression fails on (a cast that does not fit, ...) is found by halving the batch: it goes to the dead-letter
//! topic naming the transform, the expression and its record (topic, partition, offset), or stops the job
//! without one; the other rows go on. A row the chain fails on reaches no sink; a row only a sink's `select`
//! fails on still reaches the other sinks.
//!
//! What a keyed sink (an upsert key) receives must carry its key columns unchanged: a transform that drops or
//! computes them is refused at start and by `check-config`, and so is one that drops a change stream's
//! operation column in front of it (its deletes would be applied as upserts). A filter in front of a keyed sink
//! means the filtered changes are not applied: the sink keeps the key's earlier row.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_array::cast::AsArray;
use arrow_array::types::{Int32Type, Int64Type};
use arrow_schema::{Schema, SchemaRef};
use connector_api::{ChangeColumns, Error, JobId, Result, SinkId, SinkRegistry};
use transform::{Failure, Pipeline, Transform};

use crate::config::{JobConfig, SourceSetup};

/// The job's transforms and selects, planned for one source schema.
pub struct Shaping {
    /// The source's columns the transforms see (`None`: all of them, no column is hidden).
    visible: Option<Vec<usize>>,
    /// The partition and offset columns in the source's batches, to name a failing row's record.
    positions: Option<(usize, usize)>,
    /// `[[transforms]]`, over the visible columns.
    chain: Pipeline,
    /// Each sink entry's `select`, over the chain's output.
    selects: BTreeMap<SinkId, Arc<Transform>>,
}

/// One row the shaping could not take: why, and which record it was.
pub struct ShapingFailure {
    /// The row in the batch given to [`Shaping::shape`].
    pub row: usize,
    /// The sink entry whose `select` failed (`None`: a `[[transforms]]` entry; the row reached no sink).
    pub sink: Option<SinkId>,
    /// The transform and expression.
    pub failure: Failure,
    /// The record's partition and offset, when the batch carries them.
    pub position: Option<(i32, i64)>,
}

/// A batch shaped for the sinks.
pub struct Shaped {
    /// The source's rows as the transforms saw them (hidden columns dropped): what a dead letter shows.
    pub input: RecordBatch,
    /// The chain's output: what a sink without a `select` receives.
    pub rows: RecordBatch,
    /// What each sink entry with a `select` receives.
    pub selected: BTreeMap<SinkId, RecordBatch>,
    /// The rows that failed, in row order per step.
    pub failures: Vec<ShapingFailure>,
}

impl Shaped {
    /// What sink entry `entry` receives.
    pub fn rows_for(&self, entry: &SinkId) -> &RecordBatch {
        self.selected.get(entry).unwrap_or(&self.rows)
    }
}

impl Shaping {
    /// Plans `job`'s transforms and selects for `source`'s batches, and checks what the keyed sinks receive.
    ///
    /// # Errors
    /// [`Config`](connector_api::ErrorKind::Config): SQL that does not plan or is refused (named, with the
    /// expression), a keyed sink whose key column a transform drops or computes, or a change stream's operation
    /// column dropped in front of a keyed sink.
    pub fn of_job(job: &JobConfig, source: &SourceSetup) -> Result<Self> {
        let registry = crate::job::sinks::registry();
        let job_id = JobId::new(&job.job.name).ok();
        Self::plan(job, &source.schema, source, &registry, job_id.as_ref())
    }

    /// Resolves `job`'s source ([`JobConfig::resolve_source`]) and plans its shaping: for the commands that
    /// build its sinks without running it (`inspect`, `resolve`, `rescale`, `forget-topic`).
    ///
    /// # Errors
    /// As `resolve_source` and [`of_job`](Self::of_job).
    pub async fn resolve(job: &JobConfig) -> anyhow::Result<Self> {
        let source = job.resolve_source().await?;
        Ok(Self::of_job(job, &source)?)
    }

    fn plan(
        job: &JobConfig,
        schema: &SchemaRef,
        source: &SourceSetup,
        registry: &SinkRegistry,
        job_id: Option<&JobId>,
    ) -> Result<Self> {
        let visible: Vec<usize> = (0..schema.fields().len())
            .filter(|&i| !source.hidden.contains(schema.field(i).name()))
            .collect();
        let input = Arc::new(schema.project(&visible).map_err(|e| {
            Error::bug(connector_api::Phase::Setup, "the source's visible columns").with_source(e)
        })?);
        let mut stages = Vec::with_capacity(job.transforms.len());
        let mut at = input.clone();
        for (n, entry) in job.transforms.iter().enumerate() {
            let name = entry
                .name
                .clone()
                .unwrap_or_else(|| format!("transform-{}", n + 1));
            let stage = Arc::new(Transform::sql(name, &entry.sql, at)?);
            at = stage.output_schema().clone();
            stages.push(stage);
        }
        let chain = Pipeline::new(input, stages)?;
        let mut selects = BTreeMap::new();
        for spec in &job.sinks {
            if let Some(sql) = &spec.select {
                let name = format!("select of sink {}", spec.id);
                let select = Transform::sql(name, sql, chain.output_schema().clone())
                    .map_err(|e| e.with_sink(&spec.id))?;
                selects.insert(spec.id.clone(), Arc::new(select));
            }
        }
        let position = |name: &Option<String>| name.as_ref().and_then(|n| schema.index_of(n).ok());
        let positions = position(&source.metadata.partition).zip(position(&source.metadata.offset));
        let shaping = Self {
            visible: (visible.len() < schema.fields().len()).then_some(visible),
            positions,
            chain,
            selects,
        };
        for spec in &job.sinks {
            // Settings that do not parse are the sink's own error, reported when it is built or checked.
            let keys = registry.key_columns(spec, job_id).unwrap_or_default();
            shaping.check_keyed(&spec.id, &keys)?;
        }
        Ok(shaping)
    }

    /// The same transforms planned for the source's evolved `schema`.
    ///
    /// # Errors
    /// As [`of_job`](Self::of_job): a column a transform names that the source no longer has, named.
    pub fn replanned(
        &self,
        job: &JobConfig,
        schema: &SchemaRef,
        source: &SourceSetup,
    ) -> Result<Self> {
        let registry = crate::job::sinks::registry();
        let job_id = JobId::new(&job.job.name).ok();
        Self::plan(job, schema, source, &registry, job_id.as_ref())
    }

    /// The `[[transforms]]` chain.
    pub fn chain(&self) -> &Pipeline {
        &self.chain
    }

    /// The schema of what sink entry `entry` receives: what it is built for.
    pub fn sink_schema(&self, entry: &SinkId) -> SchemaRef {
        match self.selects.get(entry) {
            Some(select) => select.output_schema().clone(),
            None => self.chain.output_schema().clone(),
        }
    }

    /// The whole way from the source's visible columns to what `entry` receives.
    fn pipeline_of(&self, entry: &SinkId) -> Pipeline {
        let mut stages = self.chain.stages().to_vec();
        stages.extend(self.selects.get(entry).cloned());
        Pipeline::new(self.chain.input_schema().clone(), stages)
            .expect("each select was planned for the chain's output")
    }

    /// A keyed sink (`keys` not empty) must receive its key columns as source columns passed through, and a
    /// change stream's operation column when the source is one.
    fn check_keyed(&self, entry: &SinkId, keys: &[String]) -> Result<()> {
        let pipeline = self.pipeline_of(entry);
        if keys.is_empty() || pipeline.is_empty() {
            return Ok(());
        }
        let output = pipeline.output_schema();
        let named = pipeline
            .stages()
            .iter()
            .map(|s| format!("{:?}", s.name()))
            .collect::<Vec<_>>()
            .join(" then ");
        for key in keys {
            if pipeline.origin_of(key).is_none() {
                let what = match output.index_of(key) {
                    Err(_) => "drops",
                    Ok(_) => "computes",
                };
                return Err(Error::config(format!(
                    "sink {entry} writes rows by the key column {key:?}, which its transforms ({named}) {what}: a \
                     transform in front of a keyed sink must pass the key through unchanged (SELECT {key}, or \
                     SELECT <source column> AS {key}), or each change would update or delete another row than \
                     its record's"
                ))
                .with_sink(entry));
            }
        }
        let input = pipeline.input_schema();
        if ChangeColumns::of(input)?.is_some() && ChangeColumns::of(output)?.is_none() {
            return Err(Error::config(format!(
                "sink {entry} applies a change stream by key, but its transforms ({named}) drop the operation \
                 column {:?}: its deletes would be written as upserts; keep it (SELECT *, or name it)",
                connector_api::OP_COLUMN
            ))
            .with_sink(entry));
        }
        Ok(())
    }

    /// Shapes `batch` (of the source's schema this was planned for) for every sink; the rows an expression fails
    /// on are set aside in [`Shaped::failures`].
    pub fn shape(&self, batch: &RecordBatch) -> Result<Shaped> {
        let input = match &self.visible {
            None => batch.clone(),
            Some(columns) => batch.project(columns).map_err(|e| {
                Error::bug(connector_api::Phase::Write, "the source's visible columns")
                    .with_source(e)
            })?,
        };
        if self.chain.is_empty() && self.selects.is_empty() {
            return Ok(Shaped {
                rows: input.clone(),
                input,
                selected: BTreeMap::new(),
                failures: Vec::new(),
            });
        }
        let mut failures = Vec::new();
        // The chain over the rows it can take; `kept` maps its input rows to the batch's.
        let (clean, kept, rows) = match self.chain.apply(&input) {
            Ok(rows) => (input.clone(), None, rows),
            Err(_) => {
                let isolated = self.chain.apply_isolating(&input);
                let failed: Vec<usize> = isolated.failures.iter().map(|f| f.row).collect();
                failures.extend(isolated.failures.into_iter().map(|f| ShapingFailure {
                    position: self.position(batch, f.row),
                    row: f.row,
                    sink: None,
                    failure: f.failure,
                }));
                let kept: Vec<usize> = (0..input.num_rows())
                    .filter(|r| !failed.contains(r))
                    .collect();
                let clean = take(&input, &kept)?;
                (clean, Some(kept), isolated.rows)
            }
        };
        let mut selected = BTreeMap::new();
        for (entry, select) in &self.selects {
            let out = match select.apply(&rows) {
                Ok(out) => out,
                Err(_) => {
                    let isolated = self.pipeline_of(entry).apply_isolating(&clean);
                    for f in isolated.failures {
                        let row = kept.as_ref().map_or(f.row, |kept| kept[f.row]);
                        failures.push(ShapingFailure {
                            position: self.position(batch, row),
                            row,
                            sink: Some(entry.clone()),
                            failure: f.failure,
                        });
                    }
                    isolated.rows
                }
            };
            selected.insert(entry.clone(), out);
        }
        Ok(Shaped {
            input,
            rows,
            selected,
            failures,
        })
    }

    fn position(&self, batch: &RecordBatch, row: usize) -> Option<(i32, i64)> {
        let (partition, offset) = self.positions?;
        let partition = batch.column(partition).as_primitive_opt::<Int32Type>()?;
        let offset = batch.column(offset).as_primitive_opt::<Int64Type>()?;
        Some((partition.value(row), offset.value(row)))
    }
}

fn take(batch: &RecordBatch, rows: &[usize]) -> Result<RecordBatch> {
    let indices = arrow_array::UInt32Array::from_iter_values(rows.iter().map(|&r| r as u32));
    arrow_select::take::take_record_batch(batch, &indices).map_err(|e| {
        Error::bug(connector_api::Phase::Write, "cannot set failing rows aside").with_source(e)
    })
}

/// The schema as `check-config` prints it: `name type [not null]` per column, the `hidden` ones left out.
pub fn describe(schema: &Schema, hidden: &[String]) -> String {
    schema
        .fields()
        .iter()
        .filter(|f| !hidden.contains(f.name()))
        .map(|f| {
            format!(
                "{} {}{}",
                f.name(),
                f.data_type(),
                if f.is_nullable() { "" } else { " not null" }
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    const JOB: &str = r#"
[job]
name = "orders"

[source]
bootstrap_servers = "127.0.0.1:19092"
topic = "orders"
decoding = { kind = "json", fields = [ { name = "id", type = "int64", nullable = false }, { name = "email", type = "string" }, { name = "country", type = "string" }, { name = "amount", type = "string" }, { name = "test", type = "boolean" } ] }

[[sinks]]
type = "file"
id = "archive"
storage = { kind = "local", path = "/tmp/x" }
"#;

    fn shaping_of(text: &str) -> Result<(JobConfig, Shaping)> {
        let job = JobConfig::parse(text, Vec::new()).unwrap();
        let (decoding, metadata) = job.source.offline_decodings().unwrap().unwrap();
        let source = SourceSetup {
            schema: metadata.schema(&decoding).unwrap(),
            decoding,
            metadata,
            hidden: Vec::new(),
        };
        let shaping = Shaping::of_job(&job, &source)?;
        Ok((job, shaping))
    }

    #[test]
    fn the_transforms_in_docs_worker_md_plan() {
        let doc = include_str!("../../../docs/worker.md");
        let block = doc
            .split("```toml\n")
            .find(|block| block.starts_with("[[transforms]]\nname = \"mask\""))
            .and_then(|block| block.split("```").next())
            .expect("docs/worker.md shows transforms");
        let (job, shaping) = shaping_of(&format!("{JOB}{block}")).unwrap();
        assert_eq!(job.transforms.len(), 2);
        assert_eq!(
            describe(shaping.chain().output_schema(), &[]),
            "id Int64 not null, country Utf8, email_hash Utf8, amount Decimal128(12, 2)"
        );
        let analytics = SinkId::new("analytics").unwrap();
        assert_eq!(
            describe(&shaping.sink_schema(&analytics), &[]),
            "id Int64 not null, amount Decimal128(12, 2)"
        );
    }

    #[test]
    fn a_keyed_sink_needs_its_key_passed_through() {
        let keyed = |sql: &str| {
            format!(
                "{JOB}\n[[sinks]]\ntype = \"jdbc\"\nid = \"db\"\nurl = \"postgresql://x@127.0.0.1/x\"\n\
                 table = \"t\"\nmode = {{ kind = \"upsert\", key = [\"id\"] }}\n\n[[transforms]]\nsql = \"{sql}\"\n"
            )
        };
        assert!(
            shaping_of(&keyed(
                "SELECT order_id AS id, email FROM (SELECT id AS order_id, email FROM input)"
            ))
            .is_ok()
        );
        for (sql, says) in [
            ("SELECT id * 2 AS id, email FROM input", "computes"),
            ("SELECT email FROM input", "drops"),
        ] {
            let err = shaping_of(&keyed(sql)).err().expect(sql).to_string();
            assert!(
                err.contains("sink db") && err.contains("\"id\"") && err.contains(says),
                "{err}"
            );
        }
    }
}
