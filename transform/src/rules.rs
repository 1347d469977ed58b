//! What a transform may do: the refusals of [`Transform::sql`](crate::Transform::sql), checked on the plan
//! before it is optimized (the optimizer would fold `now()` into a constant of the planning time, hiding it).
//!
//! Allowed: `SELECT` with projection, filter, `unnest`, `UNION ALL` and subquery aliases over the table `input`,
//! with deterministic (immutable) functions. Refused, each naming what it found: functions whose result depends on
//! more than their arguments, aggregates, windows, `DISTINCT`, joins and subqueries, sorts and limits, and every
//! statement that is not a query.

use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::logical_expr::{Expr, LogicalPlan, Volatility};

/// Checks `plan` (as planned from the SQL, not optimized) against the rules; the first thing refused, explained.
pub(crate) fn check(plan: &LogicalPlan) -> Result<(), String> {
    let mut refused = None;
    plan.apply_with_subqueries(|node| {
        if let Some(why) = refused_node(node) {
            refused = Some(why);
            return Ok(TreeNodeRecursion::Stop);
        }
        node.apply_expressions(|expr| {
            expr.apply(|e| {
                if let Some(why) = refused_expr(e) {
                    refused = Some(why);
                    return Ok(TreeNodeRecursion::Stop);
                }
                Ok(TreeNodeRecursion::Continue)
            })
        })
    })
    .map_err(|e| e.to_string())?;
    match refused {
        Some(why) => Err(why),
        None => Ok(()),
    }
}

/// Why a plan node is refused (`None`: allowed).
fn refused_node(node: &LogicalPlan) -> Option<String> {
    const STATEFUL: &str = "spans batches and needs state that transforms do not keep (stateful transforms are \
                            planned); compute it downstream, in the sink's table, or in a stream processor";
    let why = match node {
        LogicalPlan::Projection(_)
        | LogicalPlan::Filter(_)
        | LogicalPlan::TableScan(_)
        | LogicalPlan::SubqueryAlias(_)
        | LogicalPlan::Unnest(_)
        | LogicalPlan::EmptyRelation(_) => return None,
        LogicalPlan::Union(_) => return None,
        LogicalPlan::Aggregate(aggregate) => format!(
            "an aggregate (GROUP BY {} / {}) {STATEFUL}",
            list(&aggregate.group_expr),
            list(&aggregate.aggr_expr)
        ),
        LogicalPlan::Window(window) => {
            format!(
                "a window function ({}) {STATEFUL}",
                list(&window.window_expr)
            )
        }
        LogicalPlan::Distinct(_) => format!("DISTINCT {STATEFUL}"),
        LogicalPlan::Join(_) => format!("a join {STATEFUL}"),
        LogicalPlan::Subquery(_) => format!("a subquery {STATEFUL}"),
        LogicalPlan::RecursiveQuery(_) => format!("a recursive query {STATEFUL}"),
        LogicalPlan::Sort(sort) => format!(
            "ORDER BY {} sorts across batches, which {STATEFUL}; the sinks keep the source's order per partition",
            sort.expr
                .iter()
                .map(|s| s.expr.human_display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        LogicalPlan::Limit(_) => {
            "LIMIT / OFFSET depends on how records happen to be batched: a replay after a \
                                  crash would keep different rows; filter with WHERE instead"
                .to_string()
        }
        LogicalPlan::Values(_) => {
            "VALUES is a table of its own: a transform reads only `input`".to_string()
        }
        LogicalPlan::Repartition(_) | LogicalPlan::Extension(_) => {
            format!("`{}` is not a row-wise operation", node.display())
        }
        LogicalPlan::Statement(_)
        | LogicalPlan::Explain(_)
        | LogicalPlan::Analyze(_)
        | LogicalPlan::Dml(_)
        | LogicalPlan::Ddl(_)
        | LogicalPlan::Copy(_)
        | LogicalPlan::DescribeTable(_) => format!(
            "`{}` is not a query: a transform is one SELECT ... FROM input",
            node.display()
        ),
    };
    Some(why)
}

/// Why an expression is refused (`None`: allowed).
fn refused_expr(expr: &Expr) -> Option<String> {
    match expr {
        Expr::ScalarFunction(call) => {
            let volatility = call.func.signature().volatility;
            (volatility != Volatility::Immutable).then(|| {
                format!(
                    "`{}` is not deterministic ({}): a replay after a crash would write different values than the \
                     first attempt; derive the value from the record instead (its columns, or the timestamp, \
                     partition and offset metadata columns)",
                    expr.human_display(),
                    match volatility {
                        Volatility::Stable => "its result depends on when it runs",
                        _ => "its result changes on every call",
                    }
                )
            })
        }
        Expr::AggregateFunction(_) => Some(format!(
            "the aggregate `{}` spans batches and needs state that transforms do not keep (stateful transforms \
             are planned)",
            expr.human_display()
        )),
        Expr::WindowFunction(_) => Some(format!(
            "the window function `{}` spans batches and needs state that transforms do not keep (stateful \
             transforms are planned)",
            expr.human_display()
        )),
        Expr::ScalarSubquery(_)
        | Expr::Exists(_)
        | Expr::InSubquery(_)
        | Expr::SetComparison(_)
        | Expr::OuterReferenceColumn(..) => Some(format!(
            "the subquery `{}` reads another relation (a join): a transform reads only `input`",
            expr.human_display()
        )),
        Expr::ScalarVariable(..) => Some(format!(
            "the variable `{}` is not part of the record: a replay could see a different value",
            expr.human_display()
        )),
        Expr::Placeholder(_) => Some(format!(
            "the placeholder `{}` has no value: write the value into the SQL",
            expr.human_display()
        )),
        _ => None,
    }
}

fn list(exprs: &[Expr]) -> String {
    exprs
        .iter()
        .map(|e| e.human_display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}
