//! A transform's optimized plan compiled into steps evaluated directly on a batch: projections and filters as
//! physical expressions (each failure names its expression), `unnest` through DataFusion's own operator, unions
//! concatenated. No session, no stream, no thread per batch.

use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch, RecordBatchOptions};
use arrow_schema::SchemaRef;
use datafusion::common::{DFSchema, UnnestOptions};
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::execution::TaskContext;
use datafusion::logical_expr::execution_props::ExecutionProps;
use datafusion::logical_expr::{Expr, LogicalPlan};
use datafusion::physical_expr::{PhysicalExpr, create_physical_expr};
use datafusion::physical_plan::unnest::{ListUnnest, UnnestExec};
use datafusion::physical_plan::{ExecutionPlan, collect};

/// An expression and how it reads in an error.
pub(crate) struct Named {
    text: String,
    expr: Arc<dyn PhysicalExpr>,
}

/// One node of a compiled transform.
pub(crate) enum Step {
    /// The input batch, with the columns the plan reads (`None`: all).
    Input { projection: Option<Vec<usize>> },
    /// Computed columns.
    Project {
        input: Box<Step>,
        exprs: Vec<Named>,
        schema: SchemaRef,
    },
    /// The rows whose predicate is true.
    Filter { input: Box<Step>, predicate: Named },
    /// The same columns under the node's schema (a subquery alias).
    Rename { input: Box<Step>, schema: SchemaRef },
    /// Lists to rows, structs to columns.
    Unnest {
        input: Box<Step>,
        lists: Vec<(usize, usize)>,
        structs: Vec<usize>,
        schema: SchemaRef,
        options: UnnestOptions,
    },
    /// The inputs' rows one after the other (`UNION ALL`).
    Union {
        inputs: Vec<Step>,
        schema: SchemaRef,
    },
    /// No rows (a filter the optimizer found always false).
    Empty { schema: SchemaRef },
}

/// A step failed: the expression (as written in errors) and what its evaluation said.
pub(crate) struct StepError {
    pub(crate) expression: String,
    pub(crate) message: String,
}

impl Step {
    /// Compiles the optimized `plan`.
    pub(crate) fn compile(plan: &LogicalPlan) -> Result<Self, String> {
        let props = ExecutionProps::new();
        let schema_of = |plan: &LogicalPlan| Arc::new(plan.schema().as_arrow().clone());
        let named = |expr: &Expr, input: &DFSchema| -> Result<Named, String> {
            Ok(Named {
                text: expr.to_string(),
                expr: create_physical_expr(expr, input, &props).map_err(|e| e.to_string())?,
            })
        };
        Ok(match plan {
            LogicalPlan::TableScan(scan) => Step::Input {
                projection: scan.projection.clone(),
            },
            LogicalPlan::Projection(projection) => Step::Project {
                input: Box::new(Self::compile(&projection.input)?),
                exprs: projection
                    .expr
                    .iter()
                    .map(|e| named(e, projection.input.schema()))
                    .collect::<Result<_, _>>()?,
                schema: schema_of(plan),
            },
            LogicalPlan::Filter(filter) => Step::Filter {
                input: Box::new(Self::compile(&filter.input)?),
                predicate: Named {
                    text: format!("WHERE {}", filter.predicate),
                    ..named(&filter.predicate, filter.input.schema())?
                },
            },
            LogicalPlan::SubqueryAlias(alias) => Step::Rename {
                input: Box::new(Self::compile(&alias.input)?),
                schema: schema_of(plan),
            },
            LogicalPlan::Unnest(unnest) => Step::Unnest {
                input: Box::new(Self::compile(&unnest.input)?),
                lists: unnest
                    .list_type_columns
                    .iter()
                    .map(|(index, list)| (*index, list.depth))
                    .collect(),
                structs: unnest.struct_type_columns.clone(),
                schema: schema_of(plan),
                options: unnest.options.clone(),
            },
            LogicalPlan::Union(union) => Step::Union {
                inputs: union
                    .inputs
                    .iter()
                    .map(|input| Self::compile(input))
                    .collect::<Result<_, _>>()?,
                schema: schema_of(plan),
            },
            LogicalPlan::EmptyRelation(empty) if !empty.produce_one_row => Step::Empty {
                schema: schema_of(plan),
            },
            other => {
                return Err(format!(
                    "the optimized plan has `{}`, which transforms cannot run",
                    other.display()
                ));
            }
        })
    }

    /// Evaluates the step on `batch` (the transform's input).
    pub(crate) fn run(&self, batch: &RecordBatch) -> Result<RecordBatch, StepError> {
        match self {
            Step::Input { projection } => match projection {
                None => Ok(batch.clone()),
                Some(columns) => batch.project(columns).map_err(|e| internal("input", e)),
            },
            Step::Project {
                input,
                exprs,
                schema,
            } => {
                let rows = input.run(batch)?;
                let columns = exprs
                    .iter()
                    .map(|named| evaluate(named, &rows))
                    .collect::<Result<Vec<ArrayRef>, _>>()?;
                with_schema(schema, columns, rows.num_rows())
            }
            Step::Filter { input, predicate } => {
                let rows = input.run(batch)?;
                let keep = evaluate(predicate, &rows)?;
                let keep = keep
                    .as_any()
                    .downcast_ref::<arrow_array::BooleanArray>()
                    .ok_or_else(|| StepError {
                        expression: predicate.text.clone(),
                        message: format!("the predicate is {}, not a boolean", keep.data_type()),
                    })?;
                arrow_select::filter::filter_record_batch(&rows, keep)
                    .map_err(|e| internal(&predicate.text, e))
            }
            Step::Rename { input, schema } => {
                let rows = input.run(batch)?;
                with_schema(schema, rows.columns().to_vec(), rows.num_rows())
            }
            Step::Unnest {
                input,
                lists,
                structs,
                schema,
                options,
            } => {
                let rows = input.run(batch)?;
                unnest(rows, lists, structs, schema, options)
            }
            Step::Union { inputs, schema } => {
                let mut parts = Vec::with_capacity(inputs.len());
                for input in inputs {
                    let rows = input.run(batch)?;
                    parts.push(with_schema(
                        schema,
                        rows.columns().to_vec(),
                        rows.num_rows(),
                    )?);
                }
                arrow_select::concat::concat_batches(schema, &parts)
                    .map_err(|e| internal("UNION ALL", e))
            }
            Step::Empty { schema } => Ok(RecordBatch::new_empty(schema.clone())),
        }
    }
}

fn evaluate(named: &Named, rows: &RecordBatch) -> Result<ArrayRef, StepError> {
    named
        .expr
        .evaluate(rows)
        .and_then(|value| value.into_array(rows.num_rows()))
        .map_err(|e| StepError {
            expression: named.text.clone(),
            message: e.strip_backtrace(),
        })
}

fn with_schema(
    schema: &SchemaRef,
    columns: Vec<ArrayRef>,
    rows: usize,
) -> Result<RecordBatch, StepError> {
    RecordBatch::try_new_with_options(
        schema.clone(),
        columns,
        &RecordBatchOptions::new().with_row_count(Some(rows)),
    )
    .map_err(|e| internal("the output columns", e))
}

/// `unnest` by DataFusion's operator, over the one batch.
fn unnest(
    rows: RecordBatch,
    lists: &[(usize, usize)],
    structs: &[usize],
    schema: &SchemaRef,
    options: &UnnestOptions,
) -> Result<RecordBatch, StepError> {
    let expression = "unnest";
    let source = MemorySourceConfig::try_new_exec(&[vec![rows.clone()]], rows.schema(), None)
        .map_err(|e| internal(expression, e))?;
    let plan: Arc<dyn ExecutionPlan> = Arc::new(
        UnnestExec::new(
            source,
            lists
                .iter()
                .map(|&(index_in_input_schema, depth)| ListUnnest {
                    index_in_input_schema,
                    depth,
                })
                .collect(),
            structs.to_vec(),
            schema.clone(),
            options.clone(),
        )
        .map_err(|e| internal(expression, e))?,
    );
    // The operator only reads the in-memory batch: nothing here waits on I/O or needs a runtime.
    let parts = futures::executor::block_on(collect(plan, Arc::new(TaskContext::default())))
        .map_err(|e| StepError {
            expression: expression.to_string(),
            message: e.strip_backtrace(),
        })?;
    arrow_select::concat::concat_batches(schema, &parts).map_err(|e| internal(expression, e))
}

fn internal(expression: &str, e: impl std::fmt::Display) -> StepError {
    StepError {
        expression: expression.to_string(),
        message: e.to_string(),
    }
}
