//! What a column means beyond its Arrow type, carried in field metadata from the decoding to the sinks, so each
//! sink can store it as what it is:
//!
//! | mark | Arrow type | meaning | set by |
//! |---|---|---|---|
//! | UUID (`ARROW:extension:name = arrow.uuid`, Arrow's canonical extension; also arrow-avro's `logicalType = uuid`) | `FixedSizeBinary(16)` | a UUID, its 16 bytes | Avro `uuid`, the JSON decoding's `uuid`, Debezium's `io.debezium.data.Uuid` |
//! | JSON (`ARROW:extension:name = arrow.json`) | `Utf8` | a JSON document as text | the JSON decoding's `json`, Debezium's `io.debezium.data.Json` (`json`/`jsonb` columns) |
//! | decimal text (`ratchet.decimal = variable-scale`) | `Utf8` | a decimal number of any scale, as its exact text (`-12.3400`) | the JSON decoding's `decimal`, Debezium's `VariableScaleDecimal` (`numeric` without a scale) |
//! | enum (`avro.enum.symbols`, arrow-avro's) | `Dictionary(Int32, Utf8)` | one of the listed symbols | Avro `enum` |

use std::collections::HashMap;

use arrow_schema::{DataType, Field};

/// The field metadata key of Arrow's extension type name.
pub const EXTENSION_NAME: &str = "ARROW:extension:name";
/// Arrow's canonical extension type of UUIDs (`FixedSizeBinary(16)`).
pub const UUID_EXTENSION: &str = "arrow.uuid";
/// Arrow's canonical extension type of JSON text (`Utf8`).
pub const JSON_EXTENSION: &str = "arrow.json";
/// The field metadata key marking decimal text.
pub const DECIMAL_TEXT: &str = "ratchet.decimal";
/// arrow-avro's key for an enum's symbols (a JSON array of strings).
pub const ENUM_SYMBOLS: &str = "avro.enum.symbols";

/// What a field is marked as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    /// A UUID in `FixedSizeBinary(16)`.
    Uuid,
    /// JSON text in `Utf8`.
    Json,
    /// A decimal of any scale as text in `Utf8`.
    DecimalText,
}

/// The mark of `field`, if it carries one that fits its type.
pub fn mark(field: &Field) -> Option<Mark> {
    let meta = field.metadata();
    let extension = meta.get(EXTENSION_NAME).map(String::as_str);
    match field.data_type() {
        DataType::FixedSizeBinary(16)
            if extension == Some(UUID_EXTENSION)
                || meta.get("logicalType").map(String::as_str) == Some("uuid") =>
        {
            Some(Mark::Uuid)
        }
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
            if extension == Some(JSON_EXTENSION) =>
        {
            Some(Mark::Json)
        }
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
            if meta.contains_key(DECIMAL_TEXT) =>
        {
            Some(Mark::DecimalText)
        }
        _ => None,
    }
}

/// `field` marked as `mark` (its type must fit the mark: `FixedSizeBinary(16)` for a UUID, a string for the others).
pub fn marked(field: Field, mark: Mark) -> Field {
    let mut metadata: HashMap<String, String> = field.metadata().clone();
    match mark {
        Mark::Uuid => metadata.insert(EXTENSION_NAME.to_string(), UUID_EXTENSION.to_string()),
        Mark::Json => metadata.insert(EXTENSION_NAME.to_string(), JSON_EXTENSION.to_string()),
        Mark::DecimalText => {
            metadata.insert(DECIMAL_TEXT.to_string(), "variable-scale".to_string())
        }
    };
    field.with_metadata(metadata)
}

/// The symbols of an enum field (arrow-avro's `avro.enum.symbols`), if it is one.
pub fn enum_symbols(field: &Field) -> Option<Vec<String>> {
    match field.data_type() {
        DataType::Dictionary(_, values) if values.as_ref() == &DataType::Utf8 => field
            .metadata()
            .get(ENUM_SYMBOLS)
            .and_then(|s| serde_json::from_str(s).ok()),
        _ => None,
    }
}

/// A UUID's 16 bytes in the canonical text form (`8-4-4-4-12` lowercase hex digits).
pub fn uuid_text(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut text = String::with_capacity(36);
    for (i, b) in bytes.iter().enumerate() {
        if bytes.len() == 16 && matches!(i, 4 | 6 | 8 | 10) {
            text.push('-');
        }
        text.push(char::from(HEX[usize::from(b >> 4)]));
        text.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    text
}

/// The 16 bytes of a UUID in text form (hyphenated or not, either case, optionally in braces or as a `urn:uuid:`).
pub fn parse_uuid(text: &str) -> Option<[u8; 16]> {
    let text = text.trim();
    let text = text.strip_prefix("urn:uuid:").unwrap_or(text);
    let text = text
        .strip_prefix('{')
        .and_then(|t| t.strip_suffix('}'))
        .unwrap_or(text);
    let digits: Vec<u8> = match text.len() {
        36 => {
            let dashes = [8, 13, 18, 23];
            if dashes.iter().any(|&i| text.as_bytes()[i] != b'-') {
                return None;
            }
            text.bytes().filter(|b| *b != b'-').collect()
        }
        32 => text.bytes().collect(),
        _ => return None,
    };
    if digits.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, pair) in digits.chunks(2).enumerate() {
        let hex = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(hex, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_round_trip_and_uuids_parse_their_usual_forms() {
        let uuid = marked(
            Field::new("id", DataType::FixedSizeBinary(16), false),
            Mark::Uuid,
        );
        assert_eq!(mark(&uuid), Some(Mark::Uuid));
        let not = marked(Field::new("id", DataType::Binary, false), Mark::Uuid);
        assert_eq!(mark(&not), None, "a mark must fit its type");
        let json = marked(Field::new("doc", DataType::Utf8, true), Mark::Json);
        assert_eq!(mark(&json), Some(Mark::Json));
        let bytes = parse_uuid("123E4567-e89b-12d3-a456-426614174000").unwrap();
        assert_eq!(uuid_text(&bytes), "123e4567-e89b-12d3-a456-426614174000");
        assert_eq!(
            parse_uuid("{123e4567e89b12d3a456426614174000}"),
            Some(bytes)
        );
        assert_eq!(parse_uuid("123e4567-e89b-12d3-a456-42661417400"), None);
        assert_eq!(parse_uuid("123e4567+e89b-12d3-a456-426614174000"), None);
    }
}
