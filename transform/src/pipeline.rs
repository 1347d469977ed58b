//! A chain of transforms, and the rows of a batch it cannot take found by halving.

use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use connector_api::{Error, Result};

use crate::failure::Failure;
use crate::plan::Transform;

/// Transforms applied one after the other: each one's input is the previous one's output. Empty: the batch as
/// it is.
#[derive(Debug, Clone)]
pub struct Pipeline {
    input: SchemaRef,
    stages: Vec<Arc<Transform>>,
}

/// One row a pipeline could not take.
#[derive(Debug, Clone)]
pub struct RowFailure {
    /// The row's index in the batch given.
    pub row: usize,
    /// The transform and expression that failed on it.
    pub failure: Failure,
}

/// What [`Pipeline::apply_isolating`] made of a batch.
#[derive(Debug, Clone)]
pub struct Isolated {
    /// The output of every row the pipeline could take, in input order.
    pub rows: RecordBatch,
    /// The rows it could not take, in input order.
    pub failures: Vec<RowFailure>,
}

impl Pipeline {
    /// The chain of `stages` over batches of `input`.
    ///
    /// # Errors
    /// [`Config`](connector_api::ErrorKind::Config) when a stage was not planned for the previous one's output.
    pub fn new(input: SchemaRef, stages: Vec<Arc<Transform>>) -> Result<Self> {
        let mut schema = &input;
        for stage in &stages {
            if stage.input_schema().fields() != schema.fields() {
                return Err(Error::config(format!(
                    "transform {:?} was planned for other columns than the previous step gives",
                    stage.name()
                )));
            }
            schema = stage.output_schema();
        }
        Ok(Self { input, stages })
    }

    /// The schema of the batches it is given.
    pub fn input_schema(&self) -> &SchemaRef {
        &self.input
    }

    /// The schema of the batches it produces.
    pub fn output_schema(&self) -> &SchemaRef {
        self.stages
            .last()
            .map_or(&self.input, |stage| stage.output_schema())
    }

    /// Its transforms, in order.
    pub fn stages(&self) -> &[Arc<Transform>] {
        &self.stages
    }

    /// Whether it has no transform (its output is its input).
    pub fn is_empty(&self) -> bool {
        self.stages.is_empty()
    }

    /// The input column that output column `column` carries unchanged through every stage (see
    /// [`Transform::origin_of`]).
    pub fn origin_of<'a>(&'a self, column: &'a str) -> Option<&'a str> {
        self.stages
            .iter()
            .rev()
            .try_fold(column, |column, stage| stage.origin_of(column))
    }

    /// Applies every stage to `batch`.
    ///
    /// # Errors
    /// The first stage's [`Failure`] when an expression fails on some row.
    pub fn apply(&self, batch: &RecordBatch) -> std::result::Result<RecordBatch, Failure> {
        let mut rows = batch.clone();
        for stage in &self.stages {
            rows = stage.apply(&rows)?;
        }
        Ok(rows)
    }

    /// Applies every stage to `batch`; when an expression fails, halves the batch until the rows that fail are
    /// single, and returns the output of all the others with each failing row and why. Transforms are
    /// functions of a row (or of a batch, the same for any split), so the output is what `apply` would give had
    /// the failing rows not been there.
    pub fn apply_isolating(&self, batch: &RecordBatch) -> Isolated {
        let mut parts = Vec::new();
        let mut failures = Vec::new();
        self.isolate(batch, 0, &mut parts, &mut failures);
        let rows = match parts.len() {
            1 => parts.pop().expect("one part"),
            _ => arrow_select::concat::concat_batches(self.output_schema(), &parts)
                .expect("the parts share the pipeline's output schema"),
        };
        Isolated { rows, failures }
    }

    fn isolate(
        &self,
        batch: &RecordBatch,
        offset: usize,
        parts: &mut Vec<RecordBatch>,
        failures: &mut Vec<RowFailure>,
    ) {
        match self.apply(batch) {
            Ok(rows) => parts.push(rows),
            Err(failure) if batch.num_rows() <= 1 => failures.push(RowFailure {
                row: offset,
                failure,
            }),
            Err(_) => {
                let half = batch.num_rows() / 2;
                self.isolate(&batch.slice(0, half), offset, parts, failures);
                self.isolate(
                    &batch.slice(half, batch.num_rows() - half),
                    offset + half,
                    parts,
                    failures,
                );
            }
        }
    }
}
