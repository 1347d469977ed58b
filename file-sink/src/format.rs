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

/// A writer that counts the bytes passed through it.
pub(crate) struct Counting<W> {
    inner: W,
    count: Arc<AtomicU64>,
}

impl<W: Write> Write for Counting<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.count.fetch_add(n as u64, Ordering::Release);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Encoded bytes are counted above the buffer (for rolling by size), flushed bytes below it (what the staging
/// file holds, readable from another handle meanwhile).
type Target = Counting<BufWriter<Counting<File>>>;

/// Writes batches of one schema in one format into a local file.
pub(crate) enum FormatWriter {
    Parquet(Box<ArrowWriter<Target>>),
    JsonLines(arrow::json::LineDelimitedWriter<Target>),
    Csv(Box<arrow::csv::Writer<Target>>),
}

/// Byte counts of an open file (shared with its writer).
#[derive(Clone)]
pub(crate) struct WrittenBytes {
    encoded: Arc<AtomicU64>,
    flushed: Arc<AtomicU64>,
}

impl WrittenBytes {
    /// Bytes the encoder produced so far (some may still sit in the write buffer).
    pub(crate) fn encoded(&self) -> u64 {
        self.encoded.load(Ordering::Acquire)
    }

    /// Bytes that reached the staging file.
    pub(crate) fn flushed(&self) -> u64 {
        self.flushed.load(Ordering::Acquire)
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
        let written = WrittenBytes {
            encoded: Arc::new(AtomicU64::new(0)),
            flushed: Arc::new(AtomicU64::new(0)),
        };
        let target = Counting {
            inner: BufWriter::with_capacity(
                1024 * 1024,
                Counting {
                    inner: file,
                    count: written.flushed.clone(),
                },
            ),
            count: written.encoded.clone(),
        };
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
                FormatWriter::JsonLines(connector_api::types::json::line_writer(
                    target,
                    connector_api::types::json::JsonOptions::default(),
                ))
            }
            FormatConfig::Csv => FormatWriter::Csv(Box::new(arrow::csv::Writer::new(target))),
        };
        Ok((writer, written))
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
        let file = target.inner.into_inner().map_err(|e| e.into_error())?;
        Ok(file.inner)
    }
}
