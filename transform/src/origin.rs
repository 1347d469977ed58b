//! Which output columns of a transform are input columns passed through unchanged (possibly renamed): a keyed
//! sink's key must be one, or a transform could rewrite which row a change applies to.

use datafusion::logical_expr::{Expr, LogicalPlan};

/// Per output column of `plan`, the input column it carries unchanged (`None`: computed, or not traceable).
pub(crate) fn origins(plan: &LogicalPlan) -> Vec<Option<String>> {
    match plan {
        LogicalPlan::TableScan(scan) => {
            let source = scan.source.schema();
            match &scan.projection {
                Some(columns) => columns
                    .iter()
                    .map(|&i| Some(source.field(i).name().clone()))
                    .collect(),
                None => source
                    .fields()
                    .iter()
                    .map(|f| Some(f.name().clone()))
                    .collect(),
            }
        }
        LogicalPlan::Projection(projection) => {
            let inner = origins(&projection.input);
            projection
                .expr
                .iter()
                .map(|expr| match unaliased(expr) {
                    Expr::Column(column) => projection
                        .input
                        .schema()
                        .index_of_column(column)
                        .ok()
                        .and_then(|i| inner.get(i).cloned().flatten()),
                    _ => None,
                })
                .collect()
        }
        LogicalPlan::Filter(filter) => origins(&filter.input),
        LogicalPlan::SubqueryAlias(alias) => origins(&alias.input),
        LogicalPlan::Unnest(unnest) => {
            let inner = origins(&unnest.input);
            let unnested: Vec<usize> = unnest
                .list_type_columns
                .iter()
                .map(|(i, _)| *i)
                .chain(unnest.struct_type_columns.iter().copied())
                .collect();
            unnest
                .dependency_indices
                .iter()
                .map(|&i| {
                    (!unnested.contains(&i))
                        .then(|| inner.get(i).cloned().flatten())
                        .flatten()
                })
                .collect()
        }
        other => vec![None; other.schema().fields().len()],
    }
}

fn unaliased(expr: &Expr) -> &Expr {
    match expr {
        Expr::Alias(alias) => unaliased(&alias.expr),
        other => other,
    }
}
