//! Exact conversions between Arrow types: [`check`] says statically whether every value of one type has a value of
//! another that means the same, [`convert`] carries it out on an array. A sink uses them to store the batches'
//! columns in its own column types: a millisecond timestamp in a table of microseconds, an enum's dictionary as
//! text, `Binary` where iceberg's Arrow schema says `LargeBinary`, a struct whose children carry a table's field
//! ids.
//!
//! | from | to | |
//! |---|---|---|
//! | any type | the same type (names and metadata of nested fields may differ) | relabelled |
//! | signed / unsigned integer | a wider integer that holds every value; `Float32` (8 and 16 bits), `Float64` (up to 32 bits); `Decimal(p, s)` with `p - s` ≥ its digits | |
//! | `Float16`, `Float32` | a wider float | |
//! | `Decimal(p1, s1)` (128 or 256 bits) | `Decimal(p2, s2)` with `s2 ≥ s1` and `p2 - s2 ≥ p1 - s1` | rescaled |
//! | `Utf8`, `LargeUtf8`, `Utf8View`; `Dictionary(_, any of them)` | any of them | |
//! | `Binary`, `LargeBinary`, `BinaryView`, `FixedSizeBinary(n)` | `Binary`, `LargeBinary`, `BinaryView`; `FixedSizeBinary(n)` from itself | |
//! | `Date32` | `Date32`, `Date64` | |
//! | `Time32` / `Time64` | the same or a finer unit | |
//! | `Timestamp(unit, zone)` | the same or a finer unit, both with a zone (any: the values are instants) or both without | a value out of the finer unit's range is an error |
//! | `Duration(unit)` | the same or a finer unit | |
//! | `List`, `LargeList`, `FixedSizeList` | `List`, `LargeList` of an exact element | |
//! | `Struct` | `Struct` with a field of the same name for each (exact), the target's other fields nullable (left null) | |
//! | `Map` | `Map` of exact keys and values | |
//!
//! Everything else is refused: narrowing, floats to decimals or integers, decimals to floats, a timestamp with a
//! zone to one without (or back), unions, intervals. A target field that is not nullable refuses nulls when
//! [`convert`]ed, not in [`check`] (a nullable column may hold none).

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{
    Array, ArrayRef, FixedSizeListArray, LargeListArray, ListArray, MapArray, StructArray,
    new_null_array,
};
use arrow_buffer::{OffsetBuffer, ScalarBuffer};
use arrow_cast::{CastOptions, cast_with_options};
use arrow_schema::{DataType, Field, FieldRef, Fields, TimeUnit};

use super::{Refusal, describe};

/// Whether every value of `from` can be stored exactly as `to` ([the table](self)); the refusal's path is relative
/// to the column (empty for the column itself, `[]` for its items, `a.b` for a struct's child).
///
/// # Errors
/// A [`Refusal`] naming the innermost field that cannot be converted and why.
pub fn check(from: &DataType, to: &DataType) -> Result<(), Refusal> {
    use DataType::*;
    let refuse = |why: String| Err(Refusal::new("", why));
    match (from, to) {
        (Dictionary(_, values), to) if !matches!(to, Dictionary(..)) => check(values, to),
        (List(f) | LargeList(f) | FixedSizeList(f, _), List(t) | LargeList(t)) => {
            check(f.data_type(), t.data_type()).map_err(|r| r.under("[]"))
        }
        (Struct(from_fields), Struct(to_fields)) => {
            for field in from_fields {
                let Some((_, target)) = to_fields.find(field.name()) else {
                    return Err(Refusal::new(
                        field.name().as_str(),
                        "has no field of that name in the target (a nested field the target lacks)",
                    ));
                };
                check(field.data_type(), target.data_type()).map_err(|r| r.under(field.name()))?;
            }
            match to_fields
                .iter()
                .find(|t| !t.is_nullable() && from_fields.find(t.name()).is_none())
            {
                Some(missing) => Err(Refusal::new(
                    missing.name().as_str(),
                    "is required in the target and missing from the source",
                )),
                None => Ok(()),
            }
        }
        (Map(from_entries, _), Map(to_entries, _)) => {
            let (fk, fv) = map_fields(from_entries);
            let (tk, tv) = map_fields(to_entries);
            check(fk.data_type(), tk.data_type()).map_err(|r| r.under("{}.key"))?;
            check(fv.data_type(), tv.data_type()).map_err(|r| r.under("{}"))
        }
        _ if leaf_exact(from, to) => Ok(()),
        _ if from.equals_datatype(to) => Ok(()),
        (Timestamp(_, Some(_)), Timestamp(_, None)) => refuse(format!(
            "has type {} (instants) and the target {} (local date-times without a zone): convert it upstream, or \
             give the target a zone",
            describe(from),
            describe(to)
        )),
        (Timestamp(_, None), Timestamp(_, Some(_))) => refuse(format!(
            "has type {} (local date-times without a zone) and the target {} (instants): convert it upstream, or \
             use a target without a zone",
            describe(from),
            describe(to)
        )),
        _ => refuse(format!(
            "has type {}, which {} cannot hold exactly",
            describe(from),
            describe(to)
        )),
    }
}

/// The key and value fields of a map's entries.
fn map_fields(entries: &FieldRef) -> (&FieldRef, &FieldRef) {
    match entries.data_type() {
        DataType::Struct(fields) if fields.len() == 2 => (&fields[0], &fields[1]),
        _ => panic!("a map's entries are a struct of key and value"),
    }
}

/// The decimal digits of every value of an integer type (its range's widest value).
fn integer_digits(ty: &DataType) -> Option<u8> {
    use DataType::*;
    Some(match ty {
        Int8 | UInt8 => 3,
        Int16 | UInt16 => 5,
        Int32 | UInt32 => 10,
        Int64 => 19,
        UInt64 => 20,
        _ => return None,
    })
}

/// Bits of a signed or unsigned integer type, and whether it is signed.
fn integer_width(ty: &DataType) -> Option<(u8, bool)> {
    use DataType::*;
    Some(match ty {
        Int8 => (8, true),
        Int16 => (16, true),
        Int32 => (32, true),
        Int64 => (64, true),
        UInt8 => (8, false),
        UInt16 => (16, false),
        UInt32 => (32, false),
        UInt64 => (64, false),
        _ => return None,
    })
}

fn unit_rank(unit: &TimeUnit) -> u8 {
    match unit {
        TimeUnit::Second => 0,
        TimeUnit::Millisecond => 1,
        TimeUnit::Microsecond => 2,
        TimeUnit::Nanosecond => 3,
    }
}

fn decimal(ty: &DataType) -> Option<(u8, i8)> {
    match ty {
        DataType::Decimal32(p, s)
        | DataType::Decimal64(p, s)
        | DataType::Decimal128(p, s)
        | DataType::Decimal256(p, s) => Some((*p, *s)),
        _ => None,
    }
}

fn is_text(ty: &DataType) -> bool {
    matches!(
        ty,
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
    )
}

fn is_bytes(ty: &DataType) -> bool {
    matches!(
        ty,
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView
    )
}

/// Whether a non-nested `from` converts exactly to `to`.
fn leaf_exact(from: &DataType, to: &DataType) -> bool {
    use DataType::*;
    if from == to {
        return true;
    }
    if let (Some((fb, fs)), Some((tb, ts))) = (integer_width(from), integer_width(to)) {
        // Wider, and signed when the source is (an unsigned source fits a signed target of more bits).
        return match (fs, ts) {
            (true, true) | (false, false) => tb >= fb,
            (false, true) => tb > fb,
            (true, false) => false,
        };
    }
    if let (Some(digits), Some((p, s))) = (integer_digits(from), decimal(to)) {
        return s >= 0 && i16::from(p) - i16::from(s) >= i16::from(digits);
    }
    if let (Some((bits, _)), Float32 | Float64) = (integer_width(from), to) {
        return bits <= if matches!(to, Float32) { 16 } else { 32 };
    }
    if let (Some((p1, s1)), Some((p2, s2))) = (decimal(from), decimal(to)) {
        return s2 >= s1 && i16::from(p2) - i16::from(s2) >= i16::from(p1) - i16::from(s1);
    }
    match (from, to) {
        (Float16, Float32 | Float64) | (Float32, Float64) => true,
        (f, t) if is_text(f) && is_text(t) => true,
        (f, t) if (is_bytes(f) || matches!(f, FixedSizeBinary(_))) && is_bytes(t) => true,
        (Date32, Date64) => true,
        (Time32(f) | Time64(f), Time32(t) | Time64(t)) => unit_rank(t) >= unit_rank(f),
        (Timestamp(f, fz), Timestamp(t, tz)) => {
            unit_rank(t) >= unit_rank(f) && fz.is_some() == tz.is_some()
        }
        (Duration(f), Duration(t)) => unit_rank(t) >= unit_rank(f),
        _ => false,
    }
}

/// Why a conversion failed on the values (the types passed [`check`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValueRefusal {
    /// The field's path within the column, as in [`Refusal`].
    pub path: String,
    /// What does not fit.
    pub why: String,
}

impl std::fmt::Display for ValueRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.path.is_empty() {
            true => f.write_str(&self.why),
            false => write!(f, "field `{}` {}", self.path, self.why),
        }
    }
}

impl std::error::Error for ValueRefusal {}

/// `array` as type `to`, every value unchanged ([the table](self)); `array`'s type must pass [`check`] against
/// `to` (checked again here).
///
/// # Errors
/// A [`ValueRefusal`] when the types do not convert, a value does not fit the target (a timestamp beyond the finer
/// unit's range, a string column past 2 GiB in a 32-bit offset type), or a target field that is not nullable
/// would get a null.
pub fn convert(array: &ArrayRef, to: &DataType) -> Result<ArrayRef, ValueRefusal> {
    if array.data_type() == to {
        return Ok(array.clone());
    }
    check(array.data_type(), to).map_err(|r| ValueRefusal {
        path: r.path,
        why: r.why,
    })?;
    convert_checked(array, to)
}

fn value_error(path: &str, why: impl Into<String>) -> ValueRefusal {
    ValueRefusal {
        path: path.to_string(),
        why: why.into(),
    }
}

fn under(parent: &str) -> impl Fn(ValueRefusal) -> ValueRefusal + '_ {
    move |mut e| {
        e.path = super::join(parent, &e.path);
        e
    }
}

fn convert_checked(array: &ArrayRef, to: &DataType) -> Result<ArrayRef, ValueRefusal> {
    use DataType::*;
    if array.data_type() == to {
        return Ok(array.clone());
    }
    match (array.data_type(), to) {
        (Dictionary(_, values), to) if !matches!(to, Dictionary(..)) => {
            let unpacked = cast_leaf(array, values)?;
            convert_checked(&unpacked, to)
        }
        (List(_) | LargeList(_) | FixedSizeList(..), List(t) | LargeList(t)) => {
            convert_list(array, t, matches!(to, LargeList(_)))
        }
        (Struct(_), Struct(fields)) => {
            let s = array.as_struct();
            Ok(Arc::new(convert_struct(s, fields)?))
        }
        (Map(_, _), Map(entries, sorted)) => {
            let map = array.as_map();
            let DataType::Struct(entry_fields) = entries.data_type() else {
                return Err(value_error("", "a map's entries are not a struct"));
            };
            let (key, value) = (&entry_fields[0], &entry_fields[1]);
            let keys = convert_checked(map.keys(), key.data_type()).map_err(under("{}.key"))?;
            let values = convert_checked(map.values(), value.data_type()).map_err(under("{}"))?;
            let entries_array = StructArray::try_new(
                entry_fields.clone(),
                vec![keys, values],
                map.entries().nulls().cloned(),
            )
            .map_err(|e| value_error("{}", format!("is required and holds nulls ({e})")))?;
            MapArray::try_new(
                entries.clone(),
                map.offsets().clone(),
                entries_array,
                map.nulls().cloned(),
                *sorted,
            )
            .map(|m| Arc::new(m) as ArrayRef)
            .map_err(|e| value_error("", e.to_string()))
        }
        _ => cast_leaf(array, to),
    }
}

/// A non-nested conversion by arrow's cast, failing (never nulling) a value that does not fit.
fn cast_leaf(array: &ArrayRef, to: &DataType) -> Result<ArrayRef, ValueRefusal> {
    let options = CastOptions {
        safe: false,
        ..Default::default()
    };
    cast_with_options(array, to, &options).map_err(|e| {
        value_error(
            "",
            format!("has a value that {} cannot hold: {e}", describe(to)),
        )
    })
}

fn convert_struct(array: &StructArray, to: &Fields) -> Result<StructArray, ValueRefusal> {
    let mut columns = Vec::with_capacity(to.len());
    for field in to {
        let column = match array.column_by_name(field.name()) {
            Some(column) => {
                convert_checked(column, field.data_type()).map_err(under(field.name()))?
            }
            None => new_null_array(field.data_type(), array.len()),
        };
        columns.push(column);
    }
    StructArray::try_new(to.clone(), columns, array.nulls().cloned()).map_err(|e| {
        let path = to
            .iter()
            .find(|f| e.to_string().contains(&format!("\"{}\"", f.name())))
            .map(|f| f.name().to_string())
            .unwrap_or_default();
        value_error(&path, format!("is required and holds nulls ({e})"))
    })
}

fn convert_list(
    array: &ArrayRef,
    element: &FieldRef,
    large: bool,
) -> Result<ArrayRef, ValueRefusal> {
    // Offsets as i64 whatever the source, the values converted.
    let (offsets, values, nulls): (Vec<i64>, ArrayRef, _) = match array.data_type() {
        DataType::List(_) => {
            let list = array.as_list::<i32>();
            (
                list.offsets().iter().map(|o| i64::from(*o)).collect(),
                list.values().clone(),
                list.nulls().cloned(),
            )
        }
        DataType::LargeList(_) => {
            let list = array.as_list::<i64>();
            (
                list.offsets().to_vec(),
                list.values().clone(),
                list.nulls().cloned(),
            )
        }
        DataType::FixedSizeList(_, size) => {
            let list: &FixedSizeListArray = array.as_fixed_size_list();
            let size = i64::from(*size);
            (
                (0..=list.len() as i64).map(|i| i * size).collect(),
                list.values().clone(),
                list.nulls().cloned(),
            )
        }
        other => return Err(value_error("", format!("{other} is not a list"))),
    };
    let values = convert_checked(&values, element.data_type()).map_err(under("[]"))?;
    if !element.is_nullable() && values.logical_null_count() > 0 {
        return Err(value_error("[]", "is required and holds nulls"));
    }
    let built: Result<ArrayRef, arrow_schema::ArrowError> = if large {
        LargeListArray::try_new(
            element.clone(),
            OffsetBuffer::new(ScalarBuffer::from(offsets)),
            values,
            nulls,
        )
        .map(|l| Arc::new(l) as ArrayRef)
    } else {
        let narrow: Option<Vec<i32>> = offsets.iter().map(|o| i32::try_from(*o).ok()).collect();
        let Some(narrow) = narrow else {
            return Err(value_error(
                "",
                "holds more list items than a 32-bit list can index",
            ));
        };
        ListArray::try_new(
            element.clone(),
            OffsetBuffer::new(ScalarBuffer::from(narrow)),
            values,
            nulls,
        )
        .map(|l| Arc::new(l) as ArrayRef)
    };
    built.map_err(|e| value_error("", e.to_string()))
}

/// `field` with the data type `to` (name, nullability and metadata kept).
pub fn retyped(field: &Field, to: DataType) -> Field {
    field.clone().with_data_type(to)
}

#[cfg(test)]
mod tests {
    use arrow_array::types::{Int32Type, TimestampMicrosecondType};
    use arrow_array::{
        Decimal128Array, DictionaryArray, Int32Array, Int64Array, StringArray,
        TimestampMillisecondArray,
    };
    use std::collections::HashMap;

    use super::*;

    fn refused(from: &DataType, to: &DataType) -> Refusal {
        check(from, to).expect_err(&format!("{from} -> {to} must be refused"))
    }

    #[test]
    fn widening_passes_and_narrowing_is_refused() {
        use DataType::*;
        let ms_utc = Timestamp(TimeUnit::Millisecond, Some("UTC".into()));
        let us_zero = Timestamp(TimeUnit::Microsecond, Some("+00:00".into()));
        for (from, to) in [
            (Int32, Int64),
            (UInt32, Int64),
            (Int64, Decimal128(19, 0)),
            (Int32, Decimal128(12, 2)),
            (Decimal128(10, 2), Decimal128(12, 4)),
            (Decimal128(10, 2), Decimal256(40, 2)),
            (ms_utc.clone(), us_zero.clone()),
            (Time32(TimeUnit::Millisecond), Time64(TimeUnit::Microsecond)),
            (Binary, LargeBinary),
            (FixedSizeBinary(16), Binary),
            (Dictionary(Box::new(Int32), Box::new(Utf8)), Utf8),
            (Float32, Float64),
            (Int16, Float32),
        ] {
            check(&from, &to).unwrap_or_else(|r| panic!("{from} -> {to}: {r}"));
        }
        for (from, to) in [
            (Int64, Int32),
            (UInt64, Int64),
            (Int64, Float64),
            (Float64, Decimal128(38, 10)),
            (Decimal128(10, 2), Decimal128(10, 4)),
            (Decimal128(12, 4), Decimal128(12, 2)),
            (Decimal128(10, 2), Float64),
            (
                us_zero.clone(),
                Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
            ),
            (
                Timestamp(TimeUnit::Nanosecond, None),
                Timestamp(TimeUnit::Microsecond, None),
            ),
            (us_zero.clone(), Timestamp(TimeUnit::Microsecond, None)),
            (Time64(TimeUnit::Nanosecond), Time64(TimeUnit::Microsecond)),
            (Binary, FixedSizeBinary(16)),
            (Utf8, Binary),
        ] {
            let refusal = refused(&from, &to);
            assert!(
                refusal.path.is_empty() && !refusal.why.is_empty(),
                "{refusal}"
            );
        }
    }

    #[test]
    fn nested_fields_are_named_by_their_path() {
        use DataType::*;
        let lines = |qty: DataType| {
            List(Arc::new(Field::new(
                "item",
                Struct(Fields::from(vec![Field::new("qty", qty, true)])),
                true,
            )))
        };
        let refusal = refused(&lines(Int64), &lines(Int32));
        assert_eq!(refusal.path, "[].qty");
        assert_eq!(refusal.clone().under("lines").path, "lines[].qty");
        let map = |value: DataType| {
            Map(
                Arc::new(Field::new(
                    "entries",
                    Struct(Fields::from(vec![
                        Field::new("key", Utf8, false),
                        Field::new("value", value, true),
                    ])),
                    false,
                )),
                false,
            )
        };
        assert_eq!(refused(&map(Float64), &map(Float32)).path, "{}");
        check(&map(Float32), &map(Float64)).unwrap();
        let extra = Struct(Fields::from(vec![Field::new("a", Int32, true)]));
        let target = Struct(Fields::from(vec![Field::new("b", Int32, true)]));
        assert_eq!(refused(&extra, &target).path, "a");
    }

    #[test]
    fn values_convert_exactly_into_the_target_with_its_field_metadata() {
        use DataType::*;
        let millis: ArrayRef = Arc::new(
            TimestampMillisecondArray::from(vec![Some(-1), None, Some(1_700_000_000_123)])
                .with_timezone("+00:00"),
        );
        let micros = convert(
            &millis,
            &Timestamp(TimeUnit::Microsecond, Some("+00:00".into())),
        )
        .unwrap();
        let micros = micros.as_primitive::<TimestampMicrosecondType>();
        assert_eq!(micros.value(0), -1000);
        assert!(micros.is_null(1));
        assert_eq!(micros.value(2), 1_700_000_000_123_000);

        let decimals: ArrayRef = Arc::new(
            Decimal128Array::from(vec![12345, -1])
                .with_precision_and_scale(10, 2)
                .unwrap(),
        );
        let wider = convert(&decimals, &Decimal128(12, 4)).unwrap();
        assert_eq!(
            wider
                .as_primitive::<arrow_array::types::Decimal128Type>()
                .value(0),
            1_234_500
        );

        let enums: ArrayRef = Arc::new(
            DictionaryArray::<Int32Type>::try_new(
                Int32Array::from(vec![1, 0]),
                Arc::new(StringArray::from(vec!["NEW", "PAID"])),
            )
            .unwrap(),
        );
        let text = convert(&enums, &Utf8).unwrap();
        assert_eq!(text.as_string::<i32>().value(0), "PAID");

        // A struct of an i32 becomes the table's struct: a child with a field id, and a new nullable child.
        let id = |n: &str| HashMap::from([("PARQUET:field_id".to_string(), n.to_string())]);
        let source = StructArray::from(vec![(
            Arc::new(Field::new("qty", Int32, true)),
            Arc::new(Int32Array::from(vec![7, 8])) as ArrayRef,
        )]);
        let target = Struct(Fields::from(vec![
            Field::new("qty", Int64, true).with_metadata(id("3")),
            Field::new("note", Utf8, true).with_metadata(id("4")),
        ]));
        let converted = convert(&(Arc::new(source) as ArrayRef), &target).unwrap();
        assert_eq!(converted.data_type(), &target);
        let s = converted.as_struct();
        assert_eq!(
            s.column(0)
                .as_primitive::<arrow_array::types::Int64Type>()
                .value(1),
            8
        );
        assert_eq!(s.column(1).null_count(), 2);

        // A list of i32 into a list whose element is named and required.
        let list: ArrayRef = Arc::new(ListArray::from_iter_primitive::<Int32Type, _, _>(vec![
            Some(vec![Some(1), Some(2)]),
            None,
        ]));
        let element = Arc::new(Field::new("element", Int64, false).with_metadata(id("5")));
        let converted = convert(&list, &List(element.clone())).unwrap();
        assert_eq!(converted.data_type(), &List(element.clone()));
        let with_null: ArrayRef =
            Arc::new(ListArray::from_iter_primitive::<Int32Type, _, _>(vec![
                Some(vec![None]),
            ]));
        let err = convert(&with_null, &List(element)).unwrap_err();
        assert_eq!(err.path, "[]");
    }

    #[test]
    fn a_value_beyond_the_finer_unit_is_an_error_not_a_null() {
        let seconds: ArrayRef =
            Arc::new(arrow_array::TimestampSecondArray::from(vec![i64::MAX / 10]));
        let err = convert(&seconds, &DataType::Timestamp(TimeUnit::Nanosecond, None)).unwrap_err();
        assert!(err.why.contains("cannot hold"), "{err}");
        let ints: ArrayRef = Arc::new(Int64Array::from(vec![1]));
        let err = convert(&ints, &DataType::Int32).unwrap_err();
        assert!(err.why.contains("cannot hold exactly"), "{err}");
    }
}
