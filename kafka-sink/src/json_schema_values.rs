//! Record values as JSON Schema through a schema registry (`records.value_format = "json-schema"`): each row is the
//! sink's JSON value ([`connector_api::types::json`], the same text `value_format = "json"` writes) in Confluent's
//! wire format (`0x00`, the schema's 4-byte id, the JSON document), its JSON Schema derived from the batches'
//! Arrow schema ([`json_schema`]) and registered under `<topic>-value` with `schemaType` JSON before any record of
//! it is sent; confluent-kafka's `JSONDeserializer` reads and validates them against it. Objects are closed
//! (`"additionalProperties": false`): a batch that gains a nullable column registers the next version, which a
//! BACKWARD compatibility rule accepts (an optional property added to a closed object).

use arrow_array::RecordBatch;
use arrow_schema::{DataType, Field, Fields, Schema};
use connector_api::Result;
use connector_api::types::json::{self, DecimalsAs, JsonOptions};
use connector_api::types::marks::{Mark, mark};
use schema_registry::{RegistrySettings, SchemaType};
use serde_json::{Value, json};

use crate::registered_subject::RegisteredSubject;

/// The subject, the JSON options the values are written with, and the schema registered last.
pub(crate) struct JsonSchemaValues {
    subject: RegisteredSubject,
    options: JsonOptions,
    registered: Option<(Fields, u32)>,
}

impl JsonSchemaValues {
    /// Values of `topic` registered in the registry `settings` describe, written with `options`.
    ///
    /// # Errors
    /// As [`RegisteredSubject::new`].
    pub(crate) fn new(
        settings: &RegistrySettings,
        topic: &str,
        options: JsonOptions,
    ) -> Result<Self> {
        Ok(Self {
            subject: RegisteredSubject::new(settings, topic)?,
            options,
            registered: None,
        })
    }

    /// Registers the JSON Schema of `schema` under the subject unless it is the one registered last.
    ///
    /// # Errors
    /// As [`RegisteredSubject::register`].
    pub(crate) async fn register(&mut self, schema: &Schema) -> Result<()> {
        if self
            .registered
            .as_ref()
            .is_some_and(|(fields, _)| fields == schema.fields())
        {
            return Ok(());
        }
        let text = json_schema(schema, self.options.decimals).to_string();
        let id = self.subject.register(&text, SchemaType::Json).await?;
        self.registered = Some((schema.fields().clone(), id));
        Ok(())
    }

    /// Every row of `batch` as one Confluent-framed JSON document, with the schema registered last (which must be
    /// the batch's: [`register`](Self::register) first).
    pub(crate) fn encode(&self, batch: &RecordBatch) -> std::result::Result<Vec<Vec<u8>>, String> {
        let id = self
            .registered
            .as_ref()
            .filter(|(fields, _)| fields == batch.schema().fields())
            .map(|(_, id)| *id)
            .ok_or("the batch's schema is not registered")?;
        let rows = json::rows(batch, self.options)?;
        Ok(rows
            .into_iter()
            .map(|row| {
                let mut value = Vec::with_capacity(row.len() + 5);
                value.push(0);
                value.extend(id.to_be_bytes());
                value.extend(row);
                value
            })
            .collect())
    }
}

/// The JSON Schema (draft 7) of rows of `schema` as the JSON encoding writes them: a closed object, its
/// non-nullable columns required.
pub(crate) fn json_schema(schema: &Schema, decimals: DecimalsAs) -> Value {
    let mut root = object(schema.fields(), decimals);
    root["$schema"] = json!("http://json-schema.org/draft-07/schema#");
    root
}

fn object(fields: &Fields, decimals: DecimalsAs) -> Value {
    let properties: serde_json::Map<String, Value> = fields
        .iter()
        .map(|f| (f.name().clone(), field_schema(f, decimals)))
        .collect();
    let required: Vec<&str> = fields
        .iter()
        .filter(|f| !f.is_nullable())
        .map(|f| f.name().as_str())
        .collect();
    json!({
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": false,
    })
}

/// The schema of `field`'s values; a nullable field admits `null` (`anyOf` with null: a JSON column's schema
/// admits null too, which `oneOf` would refuse).
fn field_schema(field: &Field, decimals: DecimalsAs) -> Value {
    let values = value_schema(field, decimals);
    if field.is_nullable() {
        json!({"anyOf": [{"type": "null"}, values]})
    } else {
        values
    }
}

fn value_schema(field: &Field, decimals: DecimalsAs) -> Value {
    use DataType::*;
    let float = |connect: &str| {
        // NaN and the infinities are written as these strings: JSON has no such numbers.
        json!({"anyOf": [{"type": "number"}, {"enum": ["NaN", "Infinity", "-Infinity"]}],
               "connect.type": connect})
    };
    let decimal = |precision: u8, scale: i8| {
        let kind = match decimals {
            DecimalsAs::Number => "number",
            DecimalsAs::String => "string",
        };
        json!({"type": kind, "title": "org.apache.kafka.connect.data.Decimal", "connect.version": 1,
               "connect.parameters": {"scale": scale.to_string(),
                                      "connect.decimal.precision": precision.to_string()}})
    };
    match field.data_type() {
        Boolean => json!({"type": "boolean"}),
        Int8 => json!({"type": "integer", "connect.type": "int8"}),
        Int16 => json!({"type": "integer", "connect.type": "int16"}),
        Int32 => json!({"type": "integer", "connect.type": "int32"}),
        Int64 => json!({"type": "integer", "connect.type": "int64"}),
        UInt8 | UInt16 | UInt32 | UInt64 => json!({"type": "integer", "minimum": 0}),
        Float16 | Float32 => float("float32"),
        Float64 => float("float64"),
        Decimal32(p, s) | Decimal64(p, s) | Decimal128(p, s) | Decimal256(p, s) => decimal(*p, *s),
        FixedSizeBinary(16) if mark(field) == Some(Mark::Uuid) => {
            json!({"type": "string", "format": "uuid"})
        }
        Binary | LargeBinary | BinaryView | FixedSizeBinary(_) => {
            json!({"type": "string", "contentEncoding": "base64"})
        }
        Utf8 | LargeUtf8 | Utf8View if mark(field) == Some(Mark::Json) => json!({}),
        Utf8 | LargeUtf8 | Utf8View | Dictionary(..) => json!({"type": "string"}),
        Date32 | Date64 => json!({"type": "string", "format": "date"}),
        Timestamp(_, Some(_)) => json!({"type": "string", "format": "date-time"}),
        // A local date-time or a time of day without an offset: JSON Schema's formats require one.
        Timestamp(_, None) | Time32(_) | Time64(_) => json!({"type": "string"}),
        Struct(fields) => object(fields, decimals),
        List(item)
        | LargeList(item)
        | FixedSizeList(item, _)
        | ListView(item)
        | LargeListView(item) => {
            json!({"type": "array", "items": field_schema(item, decimals)})
        }
        Map(entries, _) => match entries.data_type() {
            Struct(kv) if kv.len() == 2 => {
                json!({"type": "object", "additionalProperties": field_schema(&kv[1], decimals)})
            }
            _ => json!({"type": "object"}),
        },
        // Written as the JSON encoding writes them (durations and intervals as text); any value is admitted.
        _ => json!({}),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_schema::TimeUnit;

    use super::*;

    #[test]
    fn the_schema_says_what_the_json_encoding_writes() {
        let schema = Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("amount", DataType::Decimal128(12, 2), true),
            Field::new(
                "at",
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
                false,
            ),
            Field::new(
                "customer",
                DataType::Struct(vec![Field::new("email", DataType::Utf8, true)].into()),
                true,
            ),
            Field::new(
                "tags",
                DataType::List(Arc::new(Field::new("item", DataType::Utf8, true))),
                false,
            ),
        ]);
        let got = json_schema(&schema, DecimalsAs::Number);
        assert_eq!(got["required"], json!(["id", "at", "tags"]));
        assert_eq!(got["additionalProperties"], json!(false));
        assert_eq!(got["properties"]["id"]["connect.type"], "int64");
        let amount = &got["properties"]["amount"]["anyOf"][1];
        assert_eq!(amount["type"], "number");
        assert_eq!(amount["connect.parameters"]["scale"], "2");
        assert_eq!(got["properties"]["at"]["format"], "date-time");
        assert_eq!(
            got["properties"]["customer"]["anyOf"][1]["properties"]["email"]["anyOf"][1]["type"],
            "string"
        );
        assert_eq!(got["properties"]["tags"]["type"], "array");
        let strings = json_schema(&schema, DecimalsAs::String);
        assert_eq!(
            strings["properties"]["amount"]["anyOf"][1]["type"],
            "string"
        );
    }
}
