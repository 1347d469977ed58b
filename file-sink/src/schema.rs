//! Checking that a batch has the schema the sink was configured with.

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;

/// `Ok` when `batch` has exactly the fields of `expected` with the same types and no nulls where `expected`
/// forbids them; otherwise a message naming the field.
pub(crate) fn check_schema(expected: &SchemaRef, batch: &RecordBatch) -> Result<(), String> {
    let actual = batch.schema();
    for field in expected.fields() {
        match actual.field_with_name(field.name()) {
            Err(_) => {
                return Err(format!(
                    "batch has no field {:?} required by the sink's schema",
                    field.name()
                ));
            }
            Ok(got) if got.data_type() != field.data_type() => {
                return Err(format!(
                    "field {:?} has type {} but the sink's schema says {}",
                    field.name(),
                    got.data_type(),
                    field.data_type()
                ));
            }
            Ok(got) if got.is_nullable() && !field.is_nullable() => {
                let column = batch.column_by_name(field.name()).expect("field exists");
                if column.null_count() > 0 {
                    return Err(format!(
                        "field {:?} has {} null value(s) but the sink's schema does not allow nulls",
                        field.name(),
                        column.null_count()
                    ));
                }
            }
            Ok(_) => {}
        }
    }
    let extra: Vec<&str> = actual
        .fields()
        .iter()
        .filter(|f| expected.field_with_name(f.name()).is_err())
        .map(|f| f.name().as_str())
        .collect();
    if !extra.is_empty() {
        return Err(format!(
            "batch has fields {extra:?} that are not in the sink's schema"
        ));
    }
    Ok(())
}
