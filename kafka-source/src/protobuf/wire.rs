//! The fast path of the Protobuf decoding: a message read straight from the wire into the builders, without a
//! `DynamicMessage` in between, when its columns are scalars (numbers, booleans, strings, bytes, enums), nested
//! messages of such columns, `google.protobuf.Timestamp` / `Duration` or wrappers. Every other message (`repeated`,
//! maps, real `oneof`s, `Struct` / `Value`, groups) takes the general path, and so does a record whose nested
//! message appears twice on the wire (Protobuf merges the two: the general path does that).
//!
//! The wire semantics are Protobuf's: a scalar seen twice keeps its last value, unknown fields are skipped by wire
//! type, each value is parsed as the writer's field type says (`sint64` zigzag, `fixed32` little-endian, ...) and
//! then converted exactly to the reader's column; strings must be UTF-8. A record is read whole first
//! ([`FlatPlan::scan`]), so one that is not a valid message leaves the builders untouched.

use prost_reflect::{Kind, MessageDescriptor, Value};

use super::columns::{ProtoColumn, ProtoType};
use super::rows::{Cell, MessageRows, Scalar, ValueError};

/// The largest field number the fast path indexes directly.
const MAX_NUMBER: u32 = 512;

/// How one writer message is read into its columns: by field number, the column and how the writer encodes it.
#[derive(Debug)]
pub(crate) struct FlatPlan {
    /// Indexed by field number: the column it fills.
    columns: Vec<Option<usize>>,
    /// Per column: how the writer's field that fills it is read, if the writer has one.
    fields: Vec<Option<WireField>>,
    /// Per column: the value when the writer did not set it (`None`: null, the column has presence).
    defaults: Vec<Option<Value>>,
}

/// How a writer's field is read.
#[derive(Debug)]
enum WireField {
    /// A scalar of this type.
    Scalar(Kind),
    /// A nested message, into a struct column.
    Message(Box<FlatPlan>),
    /// `google.protobuf.Timestamp` or `Duration`: seconds (field 1) and nanoseconds (field 2).
    Time,
    /// A `google.protobuf.*Value` wrapper: its `value` (field 1) of this type.
    Wrapper(Kind),
}

/// Why the fast path did not decode a message.
pub(crate) enum FlatError {
    /// The body is not a valid message (the builders are untouched).
    Invalid(String),
    /// The record needs the general path (a nested message twice on the wire, which Protobuf merges, or a group);
    /// the builders are untouched.
    General,
    /// A value does not fit its column (the builders are then unusable).
    Value(ValueError),
}

/// One column's raw value as read from the wire.
enum Raw<'a> {
    /// A varint's bits.
    Bits(u64),
    /// A fixed-width or length-delimited value's bytes.
    Bytes(&'a [u8]),
    /// A nested message, read.
    Message(Vec<Option<Raw<'a>>>),
    /// A `Timestamp` or `Duration`.
    Time(i64, i32),
    /// A wrapper, and its value if set.
    Wrapper(Option<Box<Raw<'a>>>),
}

impl FlatPlan {
    /// The plan of writer message `writer` read into `columns`, when every column and the field that fills it
    /// can take the fast path.
    pub(crate) fn new(writer: &MessageDescriptor, columns: &[ProtoColumn]) -> Option<Self> {
        let mut by_number = Vec::new();
        let mut fields = Vec::with_capacity(columns.len());
        let mut defaults = Vec::with_capacity(columns.len());
        for (index, column) in columns.iter().enumerate() {
            let Some(field) = writer.get_field(column.field.number()) else {
                if !fast_column(&column.kind) {
                    return None;
                }
                fields.push(None);
                defaults.push(
                    (!column.nullable).then(|| Value::default_value_for_field(&column.field)),
                );
                continue;
            };
            let real_oneof = field.containing_oneof().is_some_and(|o| !o.is_synthetic());
            // A reader field with presence read from a writer field without it: the writer's value, its default when
            // unset, is read as it is; the general path does that.
            let presence_differs = column.nullable && !field.supports_presence();
            if field.is_list()
                || field.is_map()
                || field.is_group()
                || real_oneof
                || presence_differs
            {
                return None;
            }
            let wire = match (&column.kind, field.kind()) {
                (ProtoType::Message(nested), Kind::Message(message)) => {
                    WireField::Message(Box::new(Self::new(&message, nested)?))
                }
                (ProtoType::Timestamp, Kind::Message(m))
                    if m.full_name() == "google.protobuf.Timestamp" =>
                {
                    WireField::Time
                }
                (ProtoType::Duration, Kind::Message(m))
                    if m.full_name() == "google.protobuf.Duration" =>
                {
                    WireField::Time
                }
                (ProtoType::Wrapper(_), Kind::Message(m))
                    if m.full_name().starts_with("google.protobuf.") =>
                {
                    WireField::Wrapper(m.get_field(1)?.kind())
                }
                (ProtoType::Json | ProtoType::List(_) | ProtoType::Map(..), _)
                | (_, Kind::Message(_)) => {
                    return None;
                }
                (_, kind) => WireField::Scalar(kind),
            };
            let number = field.number();
            if number > MAX_NUMBER {
                return None;
            }
            let slot = number as usize;
            if by_number.len() <= slot {
                by_number.resize(slot + 1, None);
            }
            by_number[slot] = Some(index);
            fields.push(Some(wire));
            defaults.push((!column.nullable).then(|| Value::default_value_for_field(&field)));
        }
        Some(Self {
            columns: by_number,
            fields,
            defaults,
        })
    }

    /// Decodes `body` into one row of `rows`.
    ///
    /// # Errors
    /// As [`FlatError`].
    pub(crate) fn decode(&self, body: &[u8], rows: &mut MessageRows) -> Result<(), FlatError> {
        let scanned = self.scan(body)?;
        rows.append_cells(self.cells(scanned))
            .map_err(FlatError::Value)
    }

    /// The raw value of each column in `body`, every nested message read too.
    fn scan<'a>(&self, body: &'a [u8]) -> Result<Vec<Option<Raw<'a>>>, FlatError> {
        let mut raw: Vec<Option<Raw<'a>>> = (0..self.fields.len()).map(|_| None).collect();
        let mut at = 0;
        while at < body.len() {
            let (number, wire, value) = next_field(body, &mut at)?;
            let Some(Some(column)) = usize::try_from(number)
                .ok()
                .and_then(|n| self.columns.get(n))
            else {
                continue; // a field the columns do not read
            };
            let field = self.fields[*column]
                .as_ref()
                .expect("a numbered column has its writer's field");
            let expected = match field {
                WireField::Scalar(kind) => wire_type(kind),
                _ => 2,
            };
            if wire != expected {
                return Err(invalid(format!(
                    "has field {number} in wire type {wire}, and its type is written in wire type {expected}"
                )));
            }
            if !matches!(field, WireField::Scalar(_)) && raw[*column].is_some() {
                return Err(FlatError::General);
            }
            raw[*column] = Some(match field {
                WireField::Scalar(kind) => utf8_checked(kind, value)?,
                WireField::Message(plan) => Raw::Message(plan.scan(bytes_of(&value))?),
                WireField::Time => {
                    let (mut seconds, mut nanos) = (0, 0);
                    let inner = bytes_of(&value);
                    let mut at = 0;
                    while at < inner.len() {
                        match next_field(inner, &mut at)? {
                            (1, 0, Raw::Bits(bits)) => seconds = bits as i64,
                            (2, 0, Raw::Bits(bits)) => nanos = bits as i32,
                            (1 | 2, wire, _) => {
                                return Err(invalid(format!(
                                    "has a time field in wire type {wire}"
                                )));
                            }
                            _ => {}
                        }
                    }
                    Raw::Time(seconds, nanos)
                }
                WireField::Wrapper(kind) => {
                    let inner = bytes_of(&value);
                    let mut wrapped = None;
                    let mut at = 0;
                    while at < inner.len() {
                        let (number, wire, value) = next_field(inner, &mut at)?;
                        if number == 1 {
                            if wire != wire_type(kind) {
                                return Err(invalid(format!(
                                    "has a wrapper's value in wire type {wire}"
                                )));
                            }
                            wrapped = Some(Box::new(utf8_checked(kind, value)?));
                        }
                    }
                    Raw::Wrapper(wrapped)
                }
            });
        }
        Ok(raw)
    }

    /// The cells of one scanned message, one per column.
    fn cells<'a>(&'a self, raw: Vec<Option<Raw<'a>>>) -> Vec<Cell<'a>> {
        raw.into_iter()
            .zip(&self.fields)
            .zip(&self.defaults)
            .map(|((raw, field), default)| match (raw, field) {
                (Some(raw), Some(field)) => self.cell(raw, field),
                _ => default
                    .as_ref()
                    .and_then(Scalar::of)
                    .map_or(Cell::Null, Cell::Scalar),
            })
            .collect()
    }

    fn cell<'a>(&'a self, raw: Raw<'a>, field: &'a WireField) -> Cell<'a> {
        match (raw, field) {
            (Raw::Message(nested), WireField::Message(plan)) => {
                Cell::Message(Box::new(move |rows: &mut MessageRows| {
                    rows.append_cells(plan.cells(nested))
                }))
            }
            (Raw::Time(seconds, nanos), _) => Cell::Time(seconds, nanos),
            (Raw::Wrapper(Some(value)), WireField::Wrapper(kind)) => scalar_cell(kind, *value),
            (Raw::Wrapper(None), WireField::Wrapper(kind)) => Cell::Scalar(default_scalar(kind)),
            (raw, WireField::Scalar(kind)) => scalar_cell(kind, raw),
            _ => Cell::Null,
        }
    }
}

/// The cell of a scalar of type `kind` read as `raw`.
fn scalar_cell<'a>(kind: &Kind, raw: Raw<'a>) -> Cell<'a> {
    Cell::Scalar(scalar(kind, raw))
}

/// `raw`, once a string's bytes are checked to be UTF-8.
///
/// # Errors
/// A string that is not UTF-8.
fn utf8_checked<'a>(kind: &Kind, raw: Raw<'a>) -> Result<Raw<'a>, FlatError> {
    if let (Kind::String, Raw::Bytes(bytes)) = (kind, &raw) {
        std::str::from_utf8(bytes)
            .map_err(|e| invalid(format!("has a string field that is not UTF-8 ({e})")))?;
    }
    Ok(raw)
}

/// The value of a wrapper whose `value` is unset: its type's default.
fn default_scalar(kind: &Kind) -> Scalar<'static> {
    match kind {
        Kind::Bool => Scalar::Bool(false),
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => Scalar::I32(0),
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => Scalar::I64(0),
        Kind::Uint32 | Kind::Fixed32 => Scalar::U32(0),
        Kind::Uint64 | Kind::Fixed64 => Scalar::U64(0),
        Kind::Float => Scalar::F32(0.0),
        Kind::Double => Scalar::F64(0.0),
        Kind::String => Scalar::Str(""),
        Kind::Bytes | Kind::Message(_) => Scalar::Bytes(&[]),
        Kind::Enum(_) => Scalar::Enum(0),
    }
}

fn bytes_of<'a>(raw: &Raw<'a>) -> &'a [u8] {
    match raw {
        Raw::Bytes(bytes) => bytes,
        _ => &[],
    }
}

/// The next field of `body` at `at`: its number, wire type and raw value.
fn next_field<'a>(body: &'a [u8], at: &mut usize) -> Result<(u64, u8, Raw<'a>), FlatError> {
    let tag = varint(body, at)?;
    let (number, wire) = (tag >> 3, (tag & 7) as u8);
    if number == 0 || number > u64::from(u32::MAX >> 3) {
        return Err(invalid(format!("has field number {number}")));
    }
    let raw = match wire {
        0 => Raw::Bits(varint(body, at)?),
        1 => Raw::Bytes(take(body, at, 8)?),
        2 => {
            let len = usize::try_from(varint(body, at)?)
                .map_err(|_| invalid("has a length past memory".into()))?;
            Raw::Bytes(take(body, at, len)?)
        }
        5 => Raw::Bytes(take(body, at, 4)?),
        3 | 4 => return Err(FlatError::General), // a group: the general path reads (or skips) it
        _ => {
            return Err(invalid(format!(
                "has wire type {wire}, which Protobuf does not have"
            )));
        }
    };
    Ok((number, wire, raw))
}

fn invalid(why: String) -> FlatError {
    FlatError::Invalid(why)
}

/// Whether a column the writer lacks can be filled on the fast path (with its default or null).
fn fast_column(kind: &ProtoType) -> bool {
    !matches!(
        kind,
        ProtoType::List(_) | ProtoType::Map(..) | ProtoType::Json
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

/// The value of a field of type `kind` read as `raw` (its varint's bits, or its fixed-width or length-delimited
/// bytes; a string's checked to be UTF-8 by [`utf8_checked`]).
fn scalar<'a>(kind: &Kind, raw: Raw<'a>) -> Scalar<'a> {
    let (bits, bytes) = match raw {
        Raw::Bits(bits) => (bits, &[][..]),
        Raw::Bytes(bytes) => (0, bytes),
        _ => (0, &[][..]),
    };
    let fixed32 = || u32::from_le_bytes(bytes.try_into().unwrap_or([0; 4]));
    let fixed64 = || u64::from_le_bytes(bytes.try_into().unwrap_or([0; 8]));
    match kind {
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
        Kind::String => Scalar::Str(std::str::from_utf8(bytes).unwrap_or_default()),
        Kind::Bytes | Kind::Message(_) => Scalar::Bytes(bytes),
    }
}

/// A varint off `body` at `at` (at most 10 bytes).
fn varint(body: &[u8], at: &mut usize) -> Result<u64, FlatError> {
    let mut value = 0u64;
    for shift in 0..10 {
        let byte = *body
            .get(*at)
            .ok_or_else(|| invalid("is cut short inside a varint".into()))?;
        *at += 1;
        if shift == 9 && byte > 1 {
            return Err(invalid("has a varint past 64 bits".into()));
        }
        value |= u64::from(byte & 0x7f) << (7 * shift);
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(invalid("has a varint longer than 10 bytes".into()))
}

/// The `len` bytes of `body` at `at`, moving `at` past them.
fn take<'a>(body: &'a [u8], at: &mut usize, len: usize) -> Result<&'a [u8], FlatError> {
    let end = at
        .checked_add(len)
        .filter(|end| *end <= body.len())
        .ok_or_else(|| invalid(format!("is cut short inside a field of {len} bytes")))?;
    let bytes = &body[*at..end];
    *at = end;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use prost_reflect::prost::Message;
    use prost_reflect::{DynamicMessage, ReflectMessage};

    use super::super::columns::columns;
    use super::*;

    const READER: &str = r#"syntax = "proto3"; package t;
        import "google/protobuf/timestamp.proto"; import "google/protobuf/wrappers.proto";
        message Flat {
          int64 a = 1; sint64 b = 2; fixed32 c = 3; sfixed64 d = 4; double e = 5; float f = 6; bool g = 7;
          enum E { ZERO = 0; ONE = 1; } E h = 8; string i = 9; bytes j = 10; optional int32 k = 11; uint64 l = 12;
          message Sub { int32 x = 1; string y = 2; } Sub sub = 13; google.protobuf.Timestamp at = 14;
          google.protobuf.StringValue w = 15;
        }"#;
    /// An older writer: `a` was an int32 (read into the reader's int64), `k` and `l` did not exist, and it has a
    /// field the reader lacks (skipped).
    const OLDER: &str = r#"syntax = "proto3"; package t;
        message Flat {
          int32 a = 1; sint64 b = 2; fixed32 c = 3; sfixed64 d = 4; double e = 5; float f = 6; bool g = 7;
          enum E { ZERO = 0; ONE = 1; } E h = 8; string i = 9; bytes j = 10; string extra = 20;
          message Sub { int32 x = 1; } Sub sub = 13;
        }"#;

    async fn message(source: &str) -> MessageDescriptor {
        let file = super::super::test_files::compiled(source).await;
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
        let nested = |name: &str, fields: &[(u32, Value)]| {
            let field = descriptor.get_field_by_name(name)?;
            let mut inner = DynamicMessage::new(field.kind().as_message()?.clone());
            for (number, value) in fields {
                if inner.descriptor().get_field(*number).is_some() {
                    inner.set_field_by_number(*number, value.clone());
                }
            }
            Some(Value::Message(inner))
        };
        if i % 4 != 1 {
            let sub = nested(
                "sub",
                &[
                    (1, Value::I32(i as i32)),
                    (2, Value::String(format!("y{i}"))),
                ],
            );
            if let Some(sub) = sub {
                m.set_field_by_name("sub", sub);
            }
        }
        if i % 2 == 0 {
            let at = nested(
                "at",
                &[
                    (1, Value::I64(1_700_000_000 + i)),
                    (2, Value::I32(i as i32 * 1000)),
                ],
            );
            if let Some(at) = at {
                m.set_field_by_name("at", at);
            }
        }
        if i % 3 != 2 {
            let w = nested(
                "w",
                &[(
                    1,
                    Value::String(if i == 0 {
                        String::new()
                    } else {
                        format!("w{i}")
                    }),
                )],
            );
            if let Some(w) = w {
                m.set_field_by_name("w", w);
            }
        }
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
            for i in 0..6 {
                let message = filled(&writer, i);
                let mut body = message.encode_to_vec();
                if i == 4 {
                    // A nested message seen twice is merged: the general path's work.
                    let again = DynamicMessage::decode(writer.clone(), &body[..]).unwrap();
                    let twice = [body.clone(), again.encode_to_vec()].concat();
                    assert!(matches!(
                        plan.decode(&twice, &mut fast),
                        Err(FlatError::General)
                    ));
                }
                if i == 5 {
                    // A field seen twice keeps its last value.
                    let again = DynamicMessage::decode(writer.clone(), &body[..]).unwrap();
                    let mut twice = again.clone();
                    twice.set_field_by_name("b", Value::I64(77));
                    body.extend(twice.encode_to_vec());
                }
                assert!(plan.decode(&body, &mut fast).is_ok());
                general
                    .append(&DynamicMessage::decode(writer.clone(), &body[..]).unwrap())
                    .unwrap();
            }
            let (fast, general) = (fast.finish().unwrap(), general.finish().unwrap());
            assert_eq!(fast.len(), columns.len());
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
    async fn bodies_that_are_not_the_message_are_refused_and_repeated_fields_take_the_general_path()
    {
        let reader = message(READER).await;
        let columns = columns(&reader).unwrap();
        let plan = FlatPlan::new(&reader, &columns).unwrap();
        let mut rows = MessageRows::new(&columns, 1);
        // Field 9 (a string) with invalid UTF-8; field 1 as a length-delimited value; a cut varint; a varint past
        // 64 bits.
        for (body, why) in [
            (&[0x4a, 1, 0xff][..], "UTF-8"),
            (&[0x0a, 1, 0][..], "wire type 2"),
            (&[0x08, 0x80][..], "cut short"),
            (
                &[
                    0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f,
                ][..],
                "past 64 bits",
            ),
        ] {
            match plan.decode(body, &mut rows) {
                Err(FlatError::Invalid(message)) => {
                    assert!(message.contains(why), "{why}: {message}")
                }
                _ => panic!("{why}: accepted"),
            }
        }
        assert_eq!(rows.len(), 0);
        // A group on the wire (field 30, start and end): the general path's.
        assert!(matches!(
            plan.decode(&[0xf3, 0x01, 0xf4, 0x01], &mut rows),
            Err(FlatError::General)
        ));
        // A reader `optional` read from a writer field without presence: the general path decides null.
        let implicit = message(r#"syntax = "proto3"; message Flat { int32 k = 11; }"#).await;
        assert!(FlatPlan::new(&implicit, &columns).is_none());
        let repeated = message(
            r#"syntax = "proto3"; message N { int64 id = 1; message M { repeated int32 x = 1; } M m = 2; }"#,
        )
        .await;
        let repeated_columns = super::super::columns::columns(&repeated).unwrap();
        assert!(FlatPlan::new(&repeated, &repeated_columns).is_none());
    }
}
