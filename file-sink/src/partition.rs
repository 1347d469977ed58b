//! Splitting batches into Hive-style partition directories (`field=value/`, `dt=YYYY-MM-DD/hour=HH/`).

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use arrow::array::{Array, AsArray, UInt32Array};
use arrow::compute::{cast, take_record_batch};
use arrow::datatypes::{DataType, Int64Type, TimeUnit};
use arrow::util::display::{ArrayFormatter, FormatOptions};
use arrow_array::RecordBatch;

use crate::config::{PartitionConfig, TimeGranularity};

/// Why a batch cannot be partitioned: names the field.
pub(crate) type PartitionError = String;

/// Splits `batch` by partition directory; the directory is `""` when nothing partitions. Row order within each
/// part is kept.
pub(crate) fn split(
    config: &PartitionConfig,
    batch: &RecordBatch,
) -> Result<Vec<(String, RecordBatch)>, PartitionError> {
    if config.fields.is_empty() && config.time.is_none() {
        return Ok(vec![(String::new(), batch.clone())]);
    }
    let rows = batch.num_rows();
    let mut dirs = vec![String::new(); rows];
    let options = FormatOptions::default().with_null("__NULL__");
    for name in &config.fields {
        let column = batch
            .column_by_name(name)
            .ok_or_else(|| format!("partition field {name:?} is not in the batch"))?;
        let formatter = ArrayFormatter::try_new(column.as_ref(), &options)
            .map_err(|e| format!("partition field {name:?} cannot be formatted: {e}"))?;
        for (row, dir) in dirs.iter_mut().enumerate() {
            dir.push_str(&format!(
                "{name}={}/",
                escape(&formatter.value(row).to_string())
            ));
        }
    }
    if let Some(time) = &config.time {
        let millis = match &time.field {
            None => {
                let now = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as i64);
                vec![Some(now); rows]
            }
            Some(name) => event_millis(batch, name)?,
        };
        for (dir, ms) in dirs.iter_mut().zip(millis) {
            let ms =
                ms.ok_or("a row has a null event time; time partitions need a value in every row")?;
            dir.push_str(&time_dir(ms, time.granularity));
        }
    }
    let mut groups: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for (row, dir) in dirs.into_iter().enumerate() {
        groups.entry(dir).or_default().push(row as u32);
    }
    groups
        .into_iter()
        .map(|(dir, rows)| {
            let indices = UInt32Array::from(rows);
            take_record_batch(batch, &indices)
                .map(|part| (dir.trim_end_matches('/').to_string(), part))
                .map_err(|e| format!("cannot split the batch by partition: {e}"))
        })
        .collect()
}

/// Milliseconds since the epoch per row of an event-time field (Timestamp of any unit, or Int64 milliseconds).
fn event_millis(batch: &RecordBatch, name: &str) -> Result<Vec<Option<i64>>, PartitionError> {
    let column = batch
        .column_by_name(name)
        .ok_or_else(|| format!("time partition field {name:?} is not in the batch"))?;
    let millis = match column.data_type() {
        DataType::Int64 => column.clone(),
        DataType::Timestamp(_, _) => {
            let ms = cast(column, &DataType::Timestamp(TimeUnit::Millisecond, None))
                .map_err(|e| format!("time partition field {name:?}: {e}"))?;
            cast(&ms, &DataType::Int64)
                .map_err(|e| format!("time partition field {name:?}: {e}"))?
        }
        other => {
            return Err(format!(
                "time partition field {name:?} has type {other}; use a Timestamp or Int64 milliseconds"
            ));
        }
    };
    Ok(millis.as_primitive::<Int64Type>().iter().collect())
}

/// Characters that would change the directory structure or confuse Hive readers are percent-encoded.
fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '/' | '\\' | '=' | '%' | ':' | '\n' | '\r' | '#' | '?' => {
                out.push_str(&format!("%{:02X}", c as u32))
            }
            c if (c as u32) < 0x20 => out.push_str(&format!("%{:02X}", c as u32)),
            c => out.push(c),
        }
    }
    if out.is_empty() || out == "." || out == ".." {
        format!("%{}", out.len())
    } else {
        out
    }
}

/// `dt=YYYY-MM-DD/` or `dt=YYYY-MM-DD/hour=HH/` for a UTC instant.
fn time_dir(millis: i64, granularity: TimeGranularity) -> String {
    let days = millis.div_euclid(86_400_000);
    let (y, m, d) = civil_from_days(days);
    match granularity {
        TimeGranularity::Day => format!("dt={y:04}-{m:02}-{d:02}/"),
        TimeGranularity::Hour => {
            let hour = millis.rem_euclid(86_400_000) / 3_600_000;
            format!("dt={y:04}-{m:02}-{d:02}/hour={hour:02}/")
        }
    }
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (H. Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{Int64Array, StringArray, TimestampMicrosecondArray};
    use arrow_schema::{Field, Schema};

    use super::*;
    use crate::config::TimePartition;

    #[test]
    fn splits_by_fields_and_event_hour() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("country", DataType::Utf8, true),
            Field::new(
                "ts",
                DataType::Timestamp(TimeUnit::Microsecond, None),
                false,
            ),
            Field::new("id", DataType::Int64, false),
        ]));
        // 2026-11-30T14:00:00Z and 2026-11-30T15:30:00Z
        let t1 = 1_796_047_200_000_000i64;
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(StringArray::from(vec![
                    Some("de"),
                    Some("a/b"),
                    Some("de"),
                    None,
                ])),
                Arc::new(TimestampMicrosecondArray::from(vec![
                    t1,
                    t1,
                    t1 + 5_400_000_000,
                    t1,
                ])),
                Arc::new(Int64Array::from(vec![1, 2, 3, 4])),
            ],
        )
        .unwrap();
        let config = PartitionConfig {
            fields: vec!["country".into()],
            time: Some(TimePartition {
                field: Some("ts".into()),
                granularity: TimeGranularity::Hour,
            }),
        };
        let parts: Vec<(String, usize)> = split(&config, &batch)
            .unwrap()
            .into_iter()
            .map(|(dir, part)| (dir, part.num_rows()))
            .collect();
        assert_eq!(
            parts,
            [
                ("country=__NULL__/dt=2026-11-30/hour=14".to_string(), 1),
                ("country=a%2Fb/dt=2026-11-30/hour=14".to_string(), 1),
                ("country=de/dt=2026-11-30/hour=14".to_string(), 1),
                ("country=de/dt=2026-11-30/hour=15".to_string(), 1),
            ]
        );
    }

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_421), (2025, 11, 29));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
    }

    #[test]
    fn an_unknown_partition_field_is_named() {
        let batch = RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)])),
            vec![Arc::new(Int64Array::from(vec![1]))],
        )
        .unwrap();
        let config = PartitionConfig {
            fields: vec!["region".into()],
            time: None,
        };
        assert!(split(&config, &batch).unwrap_err().contains("\"region\""));
    }
}
