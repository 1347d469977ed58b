//! A schema as the registry returns it.

use serde::Deserialize;

/// The kind of a registered schema (`schemaType`; absent means Avro).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "UPPERCASE")]
pub enum SchemaType {
    /// Avro schema JSON.
    #[default]
    Avro,
    /// JSON Schema.
    Json,
    /// Protocol Buffers (`.proto` text).
    Protobuf,
}

impl std::fmt::Display for SchemaType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Avro => "AVRO",
            Self::Json => "JSON",
            Self::Protobuf => "PROTOBUF",
        })
    }
}

/// Another subject's schema a schema refers to by name (`references`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct SchemaReference {
    /// The name the referring schema uses for it (an Avro full name).
    pub name: String,
    /// The subject it is registered under.
    pub subject: String,
    /// Its version there.
    pub version: i32,
}

/// A schema the registry holds, with its global id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegisteredSchema {
    /// Its global id: the id a Confluent-framed record carries (`0x00`, 4-byte big-endian id, body).
    pub id: u32,
    /// The schema text (for Avro: schema JSON).
    pub schema: String,
    /// Its kind.
    pub schema_type: SchemaType,
    /// Other schemas it refers to by name (their text is not included).
    pub references: Vec<SchemaReference>,
    /// The subject and version it was looked up under (`None` when looked up by id).
    pub version: Option<(String, i32)>,
}

/// The body of `GET /schemas/ids/{id}` and `GET /subjects/{subject}/versions/{version}`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SchemaBody {
    pub(crate) schema: String,
    #[serde(default)]
    pub(crate) schema_type: SchemaType,
    #[serde(default)]
    pub(crate) references: Option<Vec<SchemaReference>>,
    #[serde(default)]
    pub(crate) id: Option<u32>,
    #[serde(default)]
    pub(crate) subject: Option<String>,
    #[serde(default)]
    pub(crate) version: Option<i32>,
}

/// An error body: `{"error_code": 40403, "message": "Schema not found"}`.
#[derive(Deserialize)]
pub(crate) struct ErrorBody {
    pub(crate) error_code: Option<u32>,
    pub(crate) message: Option<String>,
}
