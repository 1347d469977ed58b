//! Deletion vectors: how the upsert mode deletes rows of format-version 3 tables (`upsert_deletes = "position"`),
//! where position-delete files must not be added (Iceberg spec, "Delete Formats"). A deletion vector is a Puffin
//! `deletion-vector-v1` blob holding the positions deleted from one data file as a 64-bit Roaring bitmap; a
//! snapshot may hold at most one live vector per data file, so each new one holds every position deleted from its
//! file so far and replaces the one before it ([`crate::dv_commit`]).
//!
//! Pre-commit writes the checkpoint's own positions, one blob per data file, in one Puffin file
//! `<file prefix>-dv.puffin` in the table's data directory: the checkpoint's durable record of what it deletes.
//! The commit merges them with the vectors the table holds then, and writes the merged ones to a Puffin file of
//! its own when there were any.
//!
//! # Blob layout (Puffin spec, `deletion-vector-v1`)
//! A 4-byte big-endian length of what follows up to the checksum, the magic `D1 D3 39 64`, the bitmap in the
//! portable 64-bit Roaring format (an 8-byte little-endian count of 32-bit bitmaps, then for each, in ascending
//! order, its 4-byte little-endian key and the portable 32-bit bitmap: `RoaringTreemap::serialize_into`), and a
//! 4-byte big-endian CRC-32 of the magic and the bitmap. The blob's metadata names `_pos` as its field, sequence
//! number and snapshot id -1 (the writer does not know them; the manifest entry's own sequence number applies),
//! and the properties `referenced-data-file` and `cardinality`, as Iceberg's Java `BaseDVFileWriter` writes them.

use std::collections::HashMap;

use iceberg::compression::CompressionCodec;
use iceberg::metadata_columns::RESERVED_FIELD_ID_POS;
use iceberg::puffin::{Blob, DELETION_VECTOR_V1, PuffinWriter};
use iceberg::spec::{DataContentType, DataFile, DataFileBuilder, DataFileFormat, Struct};
use iceberg::table::Table;
use iceberg::{Error, ErrorKind, Result};
use roaring::RoaringTreemap;

/// The blob's magic, after its length.
const MAGIC: [u8; 4] = [0xD1, 0xD3, 0x39, 0x64];

/// Where the first blob of a Puffin file starts: after the file's 4-byte magic.
const FIRST_BLOB_OFFSET: u64 = 4;

/// The data file a deletion vector deletes from: its path, and the partition spec and partition the vector is
/// filed under (the data file's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    pub(crate) data_file: String,
    pub(crate) spec_id: i32,
    pub(crate) partition: Struct,
}

/// `positions` as a `deletion-vector-v1` blob (module docs).
pub(crate) fn encode(positions: &RoaringTreemap) -> Vec<u8> {
    let mut blob = Vec::with_capacity(positions.serialized_size() + 12);
    blob.extend_from_slice(&[0; 4]);
    blob.extend_from_slice(&MAGIC);
    positions
        .serialize_into(&mut blob)
        .expect("writing into a Vec cannot fail");
    let length = u32::try_from(blob.len() - 4).expect("a deletion vector under 4 GiB");
    blob[..4].copy_from_slice(&length.to_be_bytes());
    let checksum = crc32fast::hash(&blob[4..]);
    blob.extend_from_slice(&checksum.to_be_bytes());
    blob
}

/// The positions of a `deletion-vector-v1` blob; `what` names it in errors.
///
/// # Errors
/// [`DataInvalid`](ErrorKind::DataInvalid) naming `what` when the length, magic or checksum is wrong or the bitmap
/// does not parse.
pub(crate) fn decode(blob: &[u8], what: &str) -> Result<RoaringTreemap> {
    let invalid = |why: String| {
        Error::new(
            ErrorKind::DataInvalid,
            format!("deletion vector {what} is not a valid deletion-vector-v1 blob: {why}"),
        )
    };
    if blob.len() < 12 {
        return Err(invalid(format!("{} bytes", blob.len())));
    }
    let (length, rest) = blob.split_at(4);
    let length = u32::from_be_bytes(length.try_into().expect("4 bytes")) as usize;
    if length + 4 != rest.len() {
        return Err(invalid(format!(
            "its length says {length} bytes before the checksum, the blob holds {}",
            rest.len().saturating_sub(4)
        )));
    }
    let (body, checksum) = rest.split_at(length);
    if body[..4] != MAGIC {
        return Err(invalid(format!("magic {:02X?}", &body[..4])));
    }
    let checksum = u32::from_be_bytes(checksum.try_into().expect("4 bytes"));
    if crc32fast::hash(body) != checksum {
        return Err(invalid("its CRC-32 does not match".into()));
    }
    RoaringTreemap::deserialize_from(&body[4..]).map_err(|e| invalid(e.to_string()))
}

/// Writes `vectors` as one Puffin file at `path` (one blob per data file, in the order given) and returns their
/// manifest entries: position deletes in Puffin format, each with its data file as `referenced_data_file`, the
/// blob's offset and length as `content_offset` and `content_size_in_bytes`, its cardinality as the record count,
/// filed under its data file's partition. Nothing is written for no vectors.
///
/// # Errors
/// Storage failures (a partly written file is named by nothing: cleanup deletes it).
pub(crate) async fn write(
    table: &Table,
    path: &str,
    vectors: &[(Target, RoaringTreemap)],
) -> Result<Vec<DataFile>> {
    if vectors.is_empty() {
        return Ok(Vec::new());
    }
    let file_io = table.file_io();
    let output = file_io.new_output(path)?;
    let properties = HashMap::from([("created-by".to_string(), "Ratchet".to_string())]);
    let mut writer = PuffinWriter::new(&output, properties, false).await?;
    let mut blobs = Vec::with_capacity(vectors.len());
    let mut offset = FIRST_BLOB_OFFSET;
    for (target, positions) in vectors {
        let data = encode(positions);
        let length = data.len() as u64;
        let blob = Blob::builder()
            .r#type(DELETION_VECTOR_V1.to_string())
            .fields(vec![RESERVED_FIELD_ID_POS])
            .snapshot_id(-1)
            .sequence_number(-1)
            .data(data)
            .properties(HashMap::from([
                ("referenced-data-file".to_string(), target.data_file.clone()),
                ("cardinality".to_string(), positions.len().to_string()),
            ]))
            .build();
        writer.add(blob, CompressionCodec::None).await?;
        blobs.push((offset, length));
        offset += length;
    }
    writer.close().await?;
    let size = file_io.new_input(path)?.metadata().await?.size;
    vectors
        .iter()
        .zip(blobs)
        .map(|((target, positions), (offset, length))| {
            DataFileBuilder::default()
                .content(DataContentType::PositionDeletes)
                .file_path(path.to_string())
                .file_format(DataFileFormat::Puffin)
                .partition(target.partition.clone())
                .partition_spec_id(target.spec_id)
                .record_count(positions.len())
                .file_size_in_bytes(size)
                .referenced_data_file(Some(target.data_file.clone()))
                .content_offset(Some(offset as i64))
                .content_size_in_bytes(Some(length as i64))
                .build()
                .map_err(|e| {
                    Error::new(
                        ErrorKind::Unexpected,
                        format!(
                            "cannot describe the deletion vector of {}",
                            target.data_file
                        ),
                    )
                    .with_source(e)
                })
        })
        .collect()
}

/// Whether `file` (a delete file's manifest entry) is a deletion vector.
pub(crate) fn is_deletion_vector(file: &DataFile) -> bool {
    file.content_type() == DataContentType::PositionDeletes
        && file.file_format() == DataFileFormat::Puffin
}

/// The positions of the deletion vector `file` names (its blob, read by offset and length).
///
/// # Errors
/// [`DataInvalid`](ErrorKind::DataInvalid) for an entry without an offset or length or a blob that does not
/// decode; storage failures.
pub(crate) async fn read(table: &Table, file: &DataFile) -> Result<RoaringTreemap> {
    let what = || {
        format!(
            "{} (for {})",
            file.file_path(),
            file.referenced_data_file().unwrap_or_default()
        )
    };
    let (Some(offset), Some(length)) = (file.content_offset(), file.content_size_in_bytes()) else {
        return Err(Error::new(
            ErrorKind::DataInvalid,
            format!(
                "deletion vector {} has no content offset or size in its manifest entry",
                what()
            ),
        ));
    };
    let (offset, length) = (
        u64::try_from(offset).unwrap_or(0),
        u64::try_from(length).unwrap_or(0),
    );
    let reader = table
        .file_io()
        .new_input(file.file_path())?
        .reader()
        .await?;
    let blob = reader.read(offset..offset + length).await?;
    decode(&blob, &what())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blob_is_its_length_the_magic_the_portable_bitmap_and_a_crc_of_both() {
        let positions: RoaringTreemap = [1u64, 3, (1 << 32) + 5].into_iter().collect();
        let blob = encode(&positions);
        let mut bitmap = Vec::new();
        positions.serialize_into(&mut bitmap).unwrap();
        assert_eq!(&blob[..4], &((4 + bitmap.len()) as u32).to_be_bytes());
        assert_eq!(&blob[4..8], &MAGIC);
        assert_eq!(&blob[8..8 + bitmap.len()], &bitmap[..]);
        // Two 32-bit bitmaps (keys 0 and 1), little-endian count and keys.
        assert_eq!(&bitmap[..8], &2u64.to_le_bytes());
        assert_eq!(&bitmap[8..12], &0u32.to_le_bytes());
        let checksum = crc32fast::hash(&blob[4..8 + bitmap.len()]);
        assert_eq!(&blob[8 + bitmap.len()..], &checksum.to_be_bytes());
        assert_eq!(decode(&blob, "test").unwrap(), positions);
    }

    #[test]
    fn a_damaged_blob_is_refused_naming_it() {
        let positions: RoaringTreemap = (0u64..1000).step_by(7).collect();
        let blob = encode(&positions);
        let mut flipped = blob.clone();
        let middle = flipped.len() / 2;
        flipped[middle] ^= 0x10;
        let err = decode(&flipped, "data/x.puffin").unwrap_err().to_string();
        assert!(
            err.contains("data/x.puffin") && err.contains("CRC-32"),
            "{err}"
        );
        let err = decode(&blob[..blob.len() - 1], "short")
            .unwrap_err()
            .to_string();
        assert!(err.contains("length"), "{err}");
        let mut magic = blob.clone();
        magic[4] = 0;
        assert!(
            decode(&magic, "m")
                .unwrap_err()
                .to_string()
                .contains("magic")
        );
        assert!(decode(&[0; 5], "tiny").is_err());
    }

    #[test]
    fn an_empty_vector_round_trips() {
        let empty = RoaringTreemap::new();
        assert_eq!(decode(&encode(&empty), "empty").unwrap(), empty);
    }
}
