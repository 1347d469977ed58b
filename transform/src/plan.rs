//! [`Transform`]: one SQL query planned once against the schema of the batches it will be given.

use std::fmt;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use connector_api::{Error, Result};
use datafusion::catalog::empty::EmptyTable;
use datafusion::execution::SessionStateBuilder;
use datafusion::optimizer::Optimizer;
use datafusion::prelude::{SessionConfig, SessionContext};

use crate::failure::Failure;
use crate::steps::Step;

/// The table a transform's SQL reads: the batch it is given.
pub const INPUT_TABLE: &str = "input";

/// One stateless SQL transform (`SELECT ... FROM input ...`), planned and checked once, applied to every batch of
/// its input schema. Cheap to share (`Arc` it); applying it needs no runtime.
pub struct Transform {
    name: String,
    sql: String,
    input: SchemaRef,
    output: SchemaRef,
    origins: Vec<Option<String>>,
    steps: Step,
}

impl fmt::Debug for Transform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Transform")
            .field("name", &self.name)
            .field("sql", &self.sql)
            .finish_non_exhaustive()
    }
}

impl Transform {
    /// Plans `sql` (one `SELECT ... FROM input ...`) over batches of `input`, named `name` in every error.
    ///
    /// # Errors
    /// [`Config`](connector_api::ErrorKind::Config) naming the transform: SQL that does not parse or plan (a column `input`
    /// lacks, say: identifiers are lower-cased unless double-quoted), and every refusal of the crate docs (a
    /// non-deterministic function, an aggregate, window, join, subquery, sort or limit, a statement that is not a
    /// query), naming the expression.
    pub fn sql(name: impl Into<String>, sql: &str, input: SchemaRef) -> Result<Self> {
        let name = name.into();
        let refuse = |why: String| {
            Error::config(format!("transform {name:?}: {why}\n  SQL: {}", sql.trim()))
        };
        let context = session();
        context
            .register_table(INPUT_TABLE, Arc::new(EmptyTable::new(input.clone())))
            .map_err(|e| refuse(e.strip_backtrace()))?;
        let state = context.state();
        // Planning reads only the in-memory catalog above: nothing waits on I/O or needs a runtime.
        let planned = futures::executor::block_on(state.create_logical_plan(sql))
            .map_err(|e| refuse(e.strip_backtrace()))?;
        crate::rules::check(&planned).map_err(&refuse)?;
        let optimized = state
            .optimize(&planned)
            .map_err(|e| refuse(e.strip_backtrace()))?;
        let steps = Step::compile(&optimized).map_err(&refuse)?;
        Ok(Self {
            output: Arc::new(optimized.schema().as_arrow().clone()),
            origins: crate::origin::origins(&optimized),
            name,
            sql: sql.to_string(),
            input,
            steps,
        })
    }

    /// The same transform planned again over batches of `input` (the source's schema evolved): `SELECT *` takes
    /// the new columns, an explicit projection is unchanged.
    ///
    /// # Errors
    /// As [`sql`](Self::sql): a column the SQL names that `input` no longer has is named.
    pub fn replanned(&self, input: SchemaRef) -> Result<Self> {
        Self::sql(self.name.clone(), &self.sql, input)
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its SQL.
    pub fn sql_text(&self) -> &str {
        &self.sql
    }

    /// The schema of the batches it is given.
    pub fn input_schema(&self) -> &SchemaRef {
        &self.input
    }

    /// The schema of the batches it produces.
    pub fn output_schema(&self) -> &SchemaRef {
        &self.output
    }

    /// The input column that output column `column` carries unchanged (`SELECT id`, `SELECT id AS key`), or
    /// `None` when it is computed (`SELECT id + 1 AS id`), comes out of `unnest` or a union, or does not exist.
    pub fn origin_of(&self, column: &str) -> Option<&str> {
        let i = self.output.index_of(column).ok()?;
        self.origins.get(i)?.as_deref()
    }

    /// Applies the transform to `batch` (of [`input_schema`](Self::input_schema)).
    ///
    /// # Errors
    /// A [`Failure`] naming the expression when one fails on some row of the batch; a
    /// [`Pipeline`](crate::Pipeline) finds which rows.
    pub fn apply(&self, batch: &RecordBatch) -> std::result::Result<RecordBatch, Failure> {
        if batch.schema().fields() != self.input.fields() {
            return Err(Failure {
                transform: self.name.clone(),
                expression: INPUT_TABLE.to_string(),
                message: format!(
                    "the batch's columns are not those the transform was planned for (planned for {}, given {})",
                    self.input,
                    batch.schema()
                ),
            });
        }
        self.steps.run(batch).map_err(|e| Failure {
            transform: self.name.clone(),
            expression: e.expression,
            message: e.message,
        })
    }
}

/// Optimizer rules left out: they move sub-expressions into projections of their own under generated names
/// (`__common_expr_1`, `__datafusion_extracted_1`), for scans that can compute them; a transform has no such
/// scan, and an error must name the expression as the user wrote it.
const RULES_LEFT_OUT: [&str; 3] = [
    "common_sub_expression_eliminate",
    "extract_leaf_expressions",
    "push_down_leaf_projections",
];

/// A session holding only what transforms use: one partition, the row-wise function families and the JSON
/// functions.
fn session() -> SessionContext {
    let config = SessionConfig::new()
        .with_target_partitions(1)
        .with_information_schema(false);
    let rules = Optimizer::new()
        .rules
        .into_iter()
        .filter(|rule| !RULES_LEFT_OUT.contains(&rule.name()))
        .collect();
    let state = SessionStateBuilder::new()
        .with_config(config)
        .with_default_features()
        .with_optimizer_rules(rules)
        .build();
    let mut context = SessionContext::new_with_state(state);
    datafusion_functions_json::register_all(&mut context)
        .expect("the JSON functions register into a fresh session");
    context
}
