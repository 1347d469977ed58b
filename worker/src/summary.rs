//! What the demo wrote, read back from the visible Parquet files.

use std::collections::BTreeSet;
use std::fs::File;
use std::path::Path;

use anyhow::{Context, Result};
use arrow_array::{Int32Array, Int64Array};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

/// Rows per visible file and the set of distinct (partition, offset) pairs across them.
pub struct Summary {
    /// (file name, rows), sorted by name.
    pub files: Vec<(String, usize)>,
    /// Rows in all visible files.
    pub rows: usize,
    /// Distinct source records (partition, offset) among them.
    pub distinct: BTreeSet<(i32, i64)>,
}

/// Reads every visible (not dot-prefixed) Parquet file in `dir`.
pub fn summarize(dir: &Path) -> Result<Summary> {
    let mut files = Vec::new();
    let mut rows = 0;
    let mut distinct = BTreeSet::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let path = entry?.path();
        let name = path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        if name.starts_with('.') || !name.ends_with(".parquet") {
            continue;
        }
        let reader = ParquetRecordBatchReaderBuilder::try_new(File::open(&path)?)
            .with_context(|| format!("cannot read {}", path.display()))?
            .build()?;
        let mut file_rows = 0;
        for batch in reader {
            let batch = batch?;
            let partitions = batch
                .column_by_name("partition")
                .and_then(|c| c.as_any().downcast_ref::<Int32Array>())
                .context("no partition column")?;
            let offsets = batch
                .column_by_name("offset")
                .and_then(|c| c.as_any().downcast_ref::<Int64Array>())
                .context("no offset column")?;
            for i in 0..batch.num_rows() {
                distinct.insert((partitions.value(i), offsets.value(i)));
            }
            file_rows += batch.num_rows();
        }
        rows += file_rows;
        files.push((name, file_rows));
    }
    files.sort();
    Ok(Summary {
        files,
        rows,
        distinct,
    })
}

impl Summary {
    /// Whether any record appears more than once.
    pub fn duplicates(&self) -> usize {
        self.rows - self.distinct.len()
    }
}
