//! A data file's column bounds in the types the table's current schema gives their columns. A file written before
//! a column was widened (`evolution = "evolve"`: int to long, float to double) carries 4-byte bounds for it. Readers
//! promote those (the spec's rule; iceberg-rust 0.10 and Iceberg's Java library both do), but a manifest Ratchet
//! writes with the current schema would hold an `int` bound for a `long` column. So a file is promoted before it is
//! committed (a committable pre-committed before the change, or written by an instance still on the old schema)
//! and before a merged manifest carries it: an int bound sign-extended to 8 bytes, a float bound converted to the
//! double of the same value, as a file written after the change has them. Decimal bounds (the unscaled value's
//! bytes) read the same at any precision.

use iceberg::spec::{
    DataFile, FormatVersion, PrimitiveType, Schema, StructType, deserialize_data_file_from_json,
    serialize_data_file_to_json,
};
use iceberg::{Error, ErrorKind, Result};
use serde_json::Value;

/// `data_file` (iceberg's JSON form) with every bound of a column `schema` now types wider promoted to that type.
///
/// # Errors
/// `DataInvalid` when the text is not a data file's JSON form.
pub(crate) fn promote_json(data_file: &str, schema: &Schema) -> Result<String> {
    let mut json: Value = serde_json::from_str(data_file).map_err(|e| {
        Error::new(
            ErrorKind::DataInvalid,
            "a data file's JSON form does not parse",
        )
        .with_source(e)
    })?;
    let mut changed = false;
    for side in ["lower_bounds", "upper_bounds"] {
        let Some(entries) = json.get_mut(side).and_then(Value::as_array_mut) else {
            continue;
        };
        for entry in entries {
            let Some(id) = entry.get("key").and_then(Value::as_i64) else {
                continue;
            };
            let Some(field) = i32::try_from(id).ok().and_then(|id| schema.field_by_id(id)) else {
                continue;
            };
            let Some(bytes) = entry.get("value").and_then(Value::as_array) else {
                continue;
            };
            let bytes: Vec<u8> = bytes
                .iter()
                .filter_map(|b| b.as_u64().and_then(|b| u8::try_from(b).ok()))
                .collect();
            if let Some(promoted) = field
                .field_type
                .as_primitive_type()
                .and_then(|ty| promote(ty, &bytes))
            {
                entry["value"] = Value::from(promoted);
                changed = true;
            }
        }
    }
    Ok(match changed {
        true => json.to_string(),
        false => data_file.to_string(),
    })
}

/// `file` (of partition spec `spec_id`) with its bounds in the types `schema` gives their columns (see the module
/// docs); itself when they are.
///
/// # Errors
/// As iceberg's JSON form of data files.
pub(crate) fn promote_file(
    file: DataFile,
    spec_id: i32,
    schema: &Schema,
    partition_type: &StructType,
    version: FormatVersion,
) -> Result<DataFile> {
    let narrower = file
        .lower_bounds()
        .iter()
        .chain(file.upper_bounds())
        .any(|(id, bound)| {
            schema
                .field_by_id(*id)
                .and_then(|f| f.field_type.as_primitive_type())
                .is_some_and(|ty| {
                    matches!(ty, PrimitiveType::Long | PrimitiveType::Double)
                        && bound.data_type() != ty
                })
        });
    if !narrower {
        return Ok(file);
    }
    let json = serialize_data_file_to_json(file, partition_type, version)?;
    deserialize_data_file_from_json(
        &promote_json(&json, schema)?,
        spec_id,
        partition_type,
        schema,
    )
}

/// The bytes of a bound of type `ty` written as the narrower type before it (`None`: nothing to promote).
fn promote(ty: &PrimitiveType, bytes: &[u8]) -> Option<Vec<u8>> {
    let four: [u8; 4] = bytes.try_into().ok()?;
    match ty {
        PrimitiveType::Long => Some(i64::from(i32::from_le_bytes(four)).to_le_bytes().to_vec()),
        PrimitiveType::Double => Some(f64::from(f32::from_le_bytes(four)).to_le_bytes().to_vec()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use iceberg::spec::{NestedField, Type};

    use super::*;

    #[test]
    fn narrow_bounds_are_promoted_and_others_kept() {
        let schema = Schema::builder()
            .with_fields(vec![
                NestedField::required(1, "qty", Type::Primitive(PrimitiveType::Long)).into(),
                NestedField::optional(2, "ratio", Type::Primitive(PrimitiveType::Double)).into(),
                NestedField::optional(3, "name", Type::Primitive(PrimitiveType::String)).into(),
            ])
            .build()
            .unwrap();
        let int = (-7i32).to_le_bytes().to_vec();
        let float = 0.1f32.to_le_bytes().to_vec();
        let long = 5i64.to_le_bytes().to_vec();
        let text = b"abcd".to_vec();
        let json = serde_json::json!({
            "content": "data", "file_path": "f", "file_format": "PARQUET", "record_count": 1,
            "file_size_in_bytes": 1,
            "lower_bounds": [{"key": 1, "value": int}, {"key": 2, "value": float}, {"key": 3, "value": text}],
            "upper_bounds": [{"key": 1, "value": long}],
        })
        .to_string();
        let promoted: Value = serde_json::from_str(&promote_json(&json, &schema).unwrap()).unwrap();
        let bytes = |v: &Value| -> Vec<u8> {
            v.as_array()
                .unwrap()
                .iter()
                .map(|b| b.as_u64().unwrap() as u8)
                .collect()
        };
        let lower = &promoted["lower_bounds"];
        assert_eq!(bytes(&lower[0]["value"]), (-7i64).to_le_bytes());
        assert_eq!(bytes(&lower[1]["value"]), f64::from(0.1f32).to_le_bytes());
        assert_eq!(bytes(&lower[2]["value"]), b"abcd");
        assert_eq!(
            bytes(&promoted["upper_bounds"][0]["value"]),
            5i64.to_le_bytes()
        );
    }
}
