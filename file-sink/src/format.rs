//! Encoding Arrow batches into file bytes (Parquet, JSON lines, CSV), written to a local staging file whose size
//! is tracked while the writer owns it.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;

use crate::config::{FormatConfig, ParquetCompression};

/// A file that counts the bytes that reached it (below any buffering), readable from another handle meanwhile.
pub(crate) struct CountingFile {
    file: File,
    written: Arc<AtomicU64>,
}

impl Write for CountingFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.file.write(buf)?;
        self.written.fetch_add(n as u64, Ordering::Release);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

type Target = BufWriter<CountingFile>;

/// Writes batches of one schema in one format into a local file.
pub(crate) enum FormatWriter {
    Parquet(Box<ArrowWriter<Target>>),
    JsonLines(arrow::json::LineDelimitedWriter<Target>),
    Csv(Box<arrow::csv::Writer<Target>>),
}

/// How many bytes have reached the file (shared with the writer).
#[derive(Clone)]
pub(crate) struct WrittenBytes(Arc<AtomicU64>);

impl WrittenBytes {
    pub(crate) fn get(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }
}

fn parquet_properties(compression: ParquetCompression, row_group_size: usize) -> WriterProperties {
    let compression = match compression {
        ParquetCompression::Zstd => Compression::ZSTD(ZstdLevel::default()),
        ParquetCompression::Snappy => Compression::SNAPPY,
        ParquetCompression::Lz4 => Compression::LZ4_RAW,
        ParquetCompression::Uncompressed => Compression::UNCOMPRESSED,
    };
    WriterProperties::builder()
        .set_compression(compression)
        .set_max_row_group_row_count(Some(row_group_size.max(1)))
        .build()
}

impl FormatWriter {
    /// Starts a file of `format` on `file`.
    pub(crate) fn new(
        format: &FormatConfig,
        schema: &SchemaRef,
        file: File,
    ) -> Result<(Self, WrittenBytes), parquet::errors::ParquetError> {
        let written = Arc::new(AtomicU64::new(0));
        let target = BufWriter::with_capacity(
            1024 * 1024,
            CountingFile {
                file,
                written: written.clone(),
            },
        );
        let writer = match format {
            FormatConfig::Parquet {
                compression,
                row_group_size,
            } => FormatWriter::Parquet(Box::new(ArrowWriter::try_new(
                target,
                schema.clone(),
                Some(parquet_properties(*compression, *row_group_size)),
            )?)),
            FormatConfig::JsonLines => {
                FormatWriter::JsonLines(arrow::json::LineDelimitedWriter::new(target))
            }
            FormatConfig::Csv => FormatWriter::Csv(Box::new(arrow::csv::Writer::new(target))),
        };
        Ok((writer, WrittenBytes(written)))
    }

    /// Encodes `batch`.
    pub(crate) fn write(
        &mut self,
        batch: &RecordBatch,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        match self {
            FormatWriter::Parquet(w) => w.write(batch)?,
            FormatWriter::JsonLines(w) => w.write(batch)?,
            FormatWriter::Csv(w) => w.write(batch)?,
        }
        Ok(())
    }

    /// Bytes buffered in memory and not yet in the file (Parquet's open row group).
    pub(crate) fn buffered_bytes(&self) -> u64 {
        match self {
            FormatWriter::Parquet(w) => w.in_progress_size() as u64,
            _ => 0,
        }
    }

    /// Writes the footer (Parquet) and flushes everything into the file, which is returned for fsync.
    pub(crate) fn finish(self) -> Result<File, Box<dyn std::error::Error + Send + Sync>> {
        let target = match self {
            FormatWriter::Parquet(w) => w.into_inner()?,
            FormatWriter::JsonLines(mut w) => {
                w.finish()?;
                w.into_inner()
            }
            FormatWriter::Csv(w) => w.into_inner(),
        };
        let counting = target.into_inner().map_err(|e| e.into_error())?;
        Ok(counting.file)
    }
}
