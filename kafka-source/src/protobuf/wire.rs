//! The fast path of the Protobuf decoding: a message whose columns are all scalars (numbers, booleans, strings,
//! bytes, enums) read straight from the wire into the builders, without a `DynamicMessage` in between. Every other
//! message (nested messages, well-known types, `repeated`, maps, real `oneof`s, groups) takes the general path.
//!
//! The wire semantics are Protobuf's: a field seen twice keeps its last value, unknown fields are skipped by wire
//! type, each value is parsed as the writer's field type says (`sint64` zigzag, `fixed32` little-endian, ...) and
//! then converted exactly to the reader's column; strings must be UTF-8.

use prost_reflect::{Kind, MessageDescriptor, Value};

use super::columns::{ProtoColumn, ProtoType};
use super::rows::{MessageRows, Scalar, ValueError};

/// The largest field number the fast path indexes directly.
const MAX_NUMBER: u32 = 512;

/// How one writer message is read into scalar columns: by field number, the column and how the writer encodes it.
#[derive(Debug)]
pub(crate) struct FlatPlan {
    /// Indexed by field number: the column it fills.
    columns: Vec<Option<usize>>,
    /// Per column: the writer's type of the field that fills it, if the writer has one.
    kinds: Vec<Option<Kind>>,
    /// Per column: the value when the writer did not set it (`None`: null, the column has presence).
    defaults: Vec<Option<Value>>,
}

/// Why the fast path did not decode a message.
pub(crate) enum FlatError {
    /// The body is not a valid message.
    Invalid(String),
    /// A value does not fit its column.
    Value(ValueError),
}

impl FlatPlan {
    /// The plan of writer message `writer` read into `columns`, when every column is a scalar and every field
    /// that fills one is a singular scalar outside a real `oneof`.
    pub(crate) fn new(writer: &MessageDescriptor, columns: &[ProtoColumn]) -> Option<Self> {
        let mut by_number = Vec::new();
        let mut kinds = Vec::with_capacity(columns.len());
        let mut defaults = Vec::with_capacity(columns.len());
        for (index, column) in columns.iter().enumerate() {
            if !is_scalar(&column.kind) {
                return None;
            }
            let Some(field) = writer.get_field(column.field.number()) else {
                kinds.push(None);
                defaults.push(
                    (!column.nullable).then(|| Value::default_value_for_field(&column.field)),
                );
                continue;
            };
            let real_oneof = field.containing_oneof().is_some_and(|o| !o.is_synthetic());
            if field.is_list()
                || field.is_map()
                || real_oneof
                || matches!(field.kind(), Kind::Message(_))
            {
                return None;
            }
            let number = field.number();
            if number > MAX_NUMBER {
                return None;
            }
            let slot = number as usize;
            if by_number.len() <= slot {
                by_number.resize(slot + 1, None);
            }
            by_number[slot] = Some(index);
            kinds.push(Some(field.kind()));
            defaults.push((!column.nullable).then(|| Value::default_value_for_field(&field)));
        }
        Some(Self {
            columns: by_number,
            kinds,
            defaults,
        })
    }

    /// Decodes `body` into one row of `rows`; `slots` is scratch space, reused across records.
    ///
    /// # Errors
    /// [`FlatError::Invalid`] for a body that is not a valid message (the builders are untouched);
    /// [`FlatError::Value`] for a value that does not fit its column (the builders are then unusable).
    pub(crate) fn decode(
        &self,
        body: &[u8],
        rows: &mut MessageRows,
        slots: &mut Vec<Option<(usize, usize, u64)>>,
    ) -> Result<(), FlatError> {
        slots.clear();
        slots.resize(self.kinds.len(), None);
        let mut at = 0;
        while at < body.len() {
            let tag = varint(body, &mut at)?;
            let (number, wire) = (tag >> 3, (tag & 7) as u8);
            if number == 0 || number > u64::from(u32::MAX >> 3) {
                return Err(invalid(format!("has field number {number}")));
            }
            let (start, end, bits) = match wire {
                0 => (at, at, varint(body, &mut at)?),
                1 => (at, take(body, &mut at, 8)?, 0),
                2 => {
                    let len = usize::try_from(varint(body, &mut at)?)
                        .map_err(|_| invalid("has a length past memory".into()))?;
                    (at, take(body, &mut at, len)?, 0)
                }
                5 => (at, take(body, &mut at, 4)?, 0),
                _ => {
                    return Err(invalid(format!(
                        "has wire type {wire} (a group), which is not read here"
                    )));
                }
            };
            let Some(Some(column)) = usize::try_from(number)
                .ok()
                .and_then(|n| self.columns.get(n))
            else {
                continue; // a field the columns do not read
            };
            let kind = self.kinds[*column]
                .as_ref()
                .expect("a numbered column has its writer's kind");
            if wire != wire_type(kind) {
                return Err(invalid(format!(
                    "has field {number} in wire type {wire}, and its type is written in wire type {}",
                    wire_type(kind)
                )));
            }
            slots[*column] = Some((start, end, bits));
        }
        let mut values = Vec::with_capacity(self.kinds.len());
        for ((slot, kind), default) in slots.iter().zip(&self.kinds).zip(&self.defaults) {
            values.push(match (slot, kind) {
                (Some((start, end, bits)), Some(kind)) => {
                    Some(scalar(kind, *bits, &body[*start..*end])?)
                }
                _ => default.as_ref().and_then(Scalar::of),
            });
        }
        rows.append_scalars(values.into_iter())
            .map_err(FlatError::Value)
    }
}

fn invalid(why: String) -> FlatError {
    FlatError::Invalid(why)
}

fn is_scalar(kind: &ProtoType) -> bool {
    matches!(
        kind,
        ProtoType::Bool
            | ProtoType::Int32
            | ProtoType::Int64
            | ProtoType::UInt32
            | ProtoType::UInt64
            | ProtoType::Float32
            | ProtoType::Float64
            | ProtoType::Utf8
            | ProtoType::Binary
            | ProtoType::Enum(_)
    )
}

/// The wire type values of `kind` are written in.
fn wire_type(kind: &Kind) -> u8 {
    match kind {
        Kind::Fixed64 | Kind::Sfixed64 | Kind::Double => 1,
        Kind::String | Kind::Bytes | Kind::Message(_) => 2,
        Kind::Fixed32 | Kind::Sfixed32 | Kind::Float => 5,
        _ => 0,
    }
}

/// The value of a field of type `kind`: from its varint `bits`, or its fixed-width or length-delimited `bytes`.
///
/// # Errors
/// A string that is not UTF-8.
fn scalar<'a>(kind: &Kind, bits: u64, bytes: &'a [u8]) -> Result<Scalar<'a>, FlatError> {
    let fixed32 = || u32::from_le_bytes(bytes.try_into().unwrap_or([0; 4]));
    let fixed64 = || u64::from_le_bytes(bytes.try_into().unwrap_or([0; 8]));
    Ok(match kind {
        Kind::Bool => Scalar::Bool(bits != 0),
        // int32 is written sign-extended to 64 bits; the low 32 bits are the value.
        Kind::Int32 => Scalar::I32(bits as i32),
        Kind::Int64 => Scalar::I64(bits as i64),
        Kind::Uint32 => Scalar::U32(bits as u32),
        Kind::Uint64 => Scalar::U64(bits),
        Kind::Sint32 => Scalar::I32(((bits as u32) >> 1) as i32 ^ -((bits & 1) as i32)),
        Kind::Sint64 => Scalar::I64((bits >> 1) as i64 ^ -((bits & 1) as i64)),
        Kind::Enum(_) => Scalar::Enum(bits as i32),
        Kind::Fixed32 => Scalar::U32(fixed32()),
        Kind::Sfixed32 => Scalar::I32(fixed32() as i32),
        Kind::Float => Scalar::F32(f32::from_bits(fixed32())),
        Kind::Fixed64 => Scalar::U64(fixed64()),
        Kind::Sfixed64 => Scalar::I64(fixed64() as i64),
        Kind::Double => Scalar::F64(f64::from_bits(fixed64())),
        Kind::String => Scalar::Str(
            std::str::from_utf8(bytes)
                .map_err(|e| invalid(format!("has a string field that is not UTF-8 ({e})")))?,
        ),
        Kind::Bytes | Kind::Message(_) => Scalar::Bytes(bytes),
    })
}

/// A varint off `body` at `at` (at most 10 bytes).
fn varint(body: &[u8], at: &mut usize) -> Result<u64, FlatError> {
    let mut value = 0u64;
    for shift in 0..10 {
        let byte = *body
            .get(*at)
            .ok_or_else(|| invalid("is cut short inside a varint".into()))?;
        *at += 1;
        value |= u64::from(byte & 0x7f) << (7 * shift);
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(invalid("has a varint longer than 10 bytes".into()))
}

/// Moves `at` past `len` bytes of `body`; where they end.
fn take(body: &[u8], at: &mut usize, len: usize) -> Result<usize, FlatError> {
    let end = at
        .checked_add(len)
        .filter(|end| *end <= body.len())
        .ok_or_else(|| invalid(format!("is cut short inside a field of {len} bytes")))?;
    *at = end;
    Ok(end)
}

#[cfg(test)]
mod tests {
    use prost_reflect::DynamicMessage;
    use prost_reflect::prost::Message;

    use super::super::columns::columns;
    use super::*;

    const READER: &str = r#"syntax = "proto3"; package t;
        message Flat {
          int64 a = 1; sint64 b = 2; fixed32 c = 3; sfixed64 d = 4; double e = 5; float f = 6; bool g = 7;
          enum E { ZERO = 0; ONE = 1; } E h = 8; string i = 9; bytes j = 10; optional int32 k = 11; uint64 l = 12;
        }"#;
    /// An older writer: `a` was an int32 (read into the reader's int64), `k` and `l` did not exist, and it has a
    /// field the reader lacks (skipped).
    const OLDER: &str = r#"syntax = "proto3"; package t;
        message Flat {
          int32 a = 1; sint64 b = 2; fixed32 c = 3; sfixed64 d = 4; double e = 5; float f = 6; bool g = 7;
          enum E { ZERO = 0; ONE = 1; } E h = 8; string i = 9; bytes j = 10; string extra = 20;
        }"#;

    async fn message(source: &str) -> MessageDescriptor {
        let registry = schema_registry::SchemaRegistry::new(
            &schema_registry::RegistrySettings::new("http://127.0.0.1:9/"),
        )
        .unwrap();
        let schema = schema_registry::RegisteredSchema {
            id: 1,
            schema: source.to_string(),
            schema_type: schema_registry::SchemaType::Protobuf,
            references: Vec::new(),
            version: None,
        };
        let file = schema_registry::protobuf::compile(&registry, &schema)
            .await
            .unwrap();
        file.messages().next().unwrap()
    }

    fn filled(descriptor: &MessageDescriptor, i: i64) -> DynamicMessage {
        let mut m = DynamicMessage::new(descriptor.clone());
        let set = |m: &mut DynamicMessage, name: &str, v: Value| {
            if descriptor.get_field_by_name(name).is_some() {
                m.set_field_by_name(name, v);
            }
        };
        if descriptor.get_field_by_name("a").unwrap().kind() == Kind::Int32 {
            set(&mut m, "a", Value::I32(-(i as i32)));
        } else {
            set(&mut m, "a", Value::I64(-i * 1_000_000_000_000));
        }
        set(&mut m, "b", Value::I64(-i));
        set(&mut m, "c", Value::U32(u32::MAX - i as u32));
        set(&mut m, "d", Value::I64(i64::MIN + i));
        set(&mut m, "e", Value::F64(i as f64 / 3.0));
        set(&mut m, "f", Value::F32(-1.5));
        set(&mut m, "g", Value::Bool(i % 2 == 0));
        set(&mut m, "h", Value::EnumNumber((i % 2) as i32));
        set(&mut m, "i", Value::String(format!("é{i}")));
        set(&mut m, "j", Value::Bytes(vec![0, 255, i as u8].into()));
        if i % 3 == 0 {
            set(&mut m, "k", Value::I32(0));
        }
        set(&mut m, "l", Value::U64(u64::MAX - i as u64));
        set(&mut m, "extra", Value::String("x".into()));
        m
    }

    #[tokio::test]
    async fn the_fast_path_reads_what_the_general_path_reads() {
        let reader = message(READER).await;
        let columns = columns(&reader).unwrap();
        for writer in [reader.clone(), message(OLDER).await] {
            let plan = FlatPlan::new(&writer, &columns).expect("a flat message");
            let (mut fast, mut general) =
                (MessageRows::new(&columns, 8), MessageRows::new(&columns, 8));
            let mut slots = Vec::new();
            for i in 0..6 {
                let message = filled(&writer, i);
                let mut body = message.encode_to_vec();
                if i == 5 {
                    // A field seen twice keeps its last value.
                    let again = DynamicMessage::decode(writer.clone(), &body[..]).unwrap();
                    let mut twice = again.clone();
                    twice.set_field_by_name("b", Value::I64(77));
                    body.extend(twice.encode_to_vec());
                }
                assert!(plan.decode(&body, &mut fast, &mut slots).is_ok());
                general
                    .append(&DynamicMessage::decode(writer.clone(), &body[..]).unwrap())
                    .unwrap();
            }
            let (fast, general) = (fast.finish().unwrap(), general.finish().unwrap());
            assert_eq!(fast.len(), 12);
            for ((f, g), column) in fast.iter().zip(&general).zip(&columns) {
                assert_eq!(
                    f.to_data(),
                    g.to_data(),
                    "column {} of writer {}",
                    column.name(),
                    writer.full_name()
                );
            }
        }
    }

    #[tokio::test]
    async fn bodies_that_are_not_the_message_are_refused_and_nested_messages_take_the_general_path()
    {
        let reader = message(READER).await;
        let columns = columns(&reader).unwrap();
        let plan = FlatPlan::new(&reader, &columns).unwrap();
        let mut rows = MessageRows::new(&columns, 1);
        let mut slots = Vec::new();
        // Field 9 (a string) with invalid UTF-8; field 1 as a length-delimited value; a cut varint.
        for (body, why) in [
            (&[0x4a, 1, 0xff][..], "UTF-8"),
            (&[0x0a, 1, 0][..], "wire type 2"),
            (&[0x08, 0x80][..], "cut short"),
        ] {
            match plan.decode(body, &mut rows, &mut slots) {
                Err(FlatError::Invalid(message)) => {
                    assert!(message.contains(why), "{why}: {message}")
                }
                _ => panic!("{why}: accepted"),
            }
        }
        assert_eq!(rows.len(), 0);
        let nested = message(
            r#"syntax = "proto3"; message N { int64 id = 1; message M { int32 x = 1; } M m = 2; }"#,
        )
        .await;
        let nested_columns = super::super::columns::columns(&nested).unwrap();
        assert!(FlatPlan::new(&nested, &nested_columns).is_none());
    }
}
