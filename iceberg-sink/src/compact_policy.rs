//! The job file's `compact` policy of the Iceberg sink (`compact = { target_file_size = "128MB",
//! min_input_files = 8 }`): its keys, their defaults, and the checks `check-config` and the sink's start run.
//! What it drives: [`crate::compaction`].

use connector_api::{Error, Result, SinkId};
use iceberg::table::Table;
use serde::{Deserialize, Deserializer};

/// The default `compact.target_file_size`: 128 MiB, Iceberg's `write.target-file-size-bytes`.
pub const DEFAULT_COMPACT_TARGET_FILE_SIZE: u64 = 128 << 20;
/// The default `compact.min_input_files`: Iceberg's `rewrite_data_files` default `min-input-files` is 5; 8 keeps
/// the write amplification of 1 s checkpoints lower.
pub const DEFAULT_COMPACT_MIN_INPUT_FILES: usize = 8;

/// The job file's `compact` policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompactPolicy {
    /// The size a rewritten file aims at, in bytes or with a unit (`"128MB"`: powers of 1024, as Spark reads
    /// them); files under ¾ of it are small.
    #[serde(default = "default_target_file_size", deserialize_with = "byte_size")]
    pub target_file_size: u64,
    /// How many small files of one partition and size tier a rewrite waits for (at least 2).
    #[serde(default = "default_min_input_files")]
    pub min_input_files: usize,
}

impl Default for CompactPolicy {
    fn default() -> Self {
        Self {
            target_file_size: DEFAULT_COMPACT_TARGET_FILE_SIZE,
            min_input_files: DEFAULT_COMPACT_MIN_INPUT_FILES,
        }
    }
}

fn default_target_file_size() -> u64 {
    DEFAULT_COMPACT_TARGET_FILE_SIZE
}

fn default_min_input_files() -> usize {
    DEFAULT_COMPACT_MIN_INPUT_FILES
}

impl CompactPolicy {
    /// Checks the policy of sink `sink`, whose rows are upserted by `upsert_key` (empty: appended).
    ///
    /// # Errors
    /// [`Config`](connector_api::ErrorKind::Config) naming the key: `min_input_files` below 2, `target_file_size` below 1 KiB,
    /// or an upsert key (a rewrite of an upsert table must carry its deletes and the key index along: planned).
    pub fn check(&self, sink: &SinkId, upsert_key: &[String]) -> Result<()> {
        let refuse = |why: String| Err(Error::config(format!("sink {sink}: compact: {why}")));
        if !upsert_key.is_empty() {
            return refuse(
                "the sink compacts append tables only; an upsert table's rewrite must carry its position deletes \
                 and the key index along, which it does not do yet (planned). Remove `compact` and compact the \
                 table with Spark's rewrite_data_files beside the sink (docs/worker.md, \"Maintaining a table \
                 with Spark\")"
                    .to_string(),
            );
        }
        if self.min_input_files < 2 {
            return refuse(format!(
                "min_input_files = {} rewrites nothing useful: use 2 or more (the default is {})",
                self.min_input_files, DEFAULT_COMPACT_MIN_INPUT_FILES
            ));
        }
        if self.target_file_size < 1024 {
            return refuse(format!(
                "target_file_size = {} bytes is smaller than a Parquet file's own overhead: use at least \"1KB\" \
                 (the default is \"128MB\")",
                self.target_file_size
            ));
        }
        Ok(())
    }

    /// Checks that `table` can be compacted by sink `sink`.
    ///
    /// # Errors
    /// [`Config`](connector_api::ErrorKind::Config) naming the table for a format-version 3 table (Ratchet's own commit writes
    /// version 1 and 2 manifest lists; version 3's carry row lineage, which it does not assign).
    pub(crate) fn check_table(&self, sink: &SinkId, table: &Table) -> Result<()> {
        match table.metadata().format_version() {
            iceberg::spec::FormatVersion::V1 | iceberg::spec::FormatVersion::V2 => Ok(()),
            version => Err(Error::config(format!(
                "sink {sink}: compact: table {} is an Iceberg format-version {version} table; the sink compacts \
                 version 1 and 2 tables (version 3 manifest lists carry row lineage, which it does not assign): \
                 remove compact and compact the table with Spark",
                table.identifier()
            ))),
        }
    }

    /// Files at or above this size are not small.
    pub(crate) fn small_below(&self) -> u64 {
        self.target_file_size / 4 * 3
    }

    /// The size tier of a file of `size` bytes: sizes within a factor `min_input_files` share one.
    pub(crate) fn tier(&self, size: u64) -> u32 {
        size.max(1).ilog(self.min_input_files as u64)
    }
}

/// `"128MB"`, `"64 KiB"`, `"1g"` or a number of bytes.
fn byte_size<'de, D: Deserializer<'de>>(deserializer: D) -> std::result::Result<u64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Bytes(u64),
        Text(String),
    }
    match Raw::deserialize(deserializer)? {
        Raw::Bytes(bytes) => Ok(bytes),
        Raw::Text(text) => parse_byte_size(&text).map_err(serde::de::Error::custom),
    }
}

/// Parses a size: digits, then an optional unit `B`, `K`/`KB`/`KiB`, `M`/`MB`/`MiB`, `G`/`GB`/`GiB` (any case;
/// powers of 1024, as Spark's byte strings).
pub(crate) fn parse_byte_size(text: &str) -> std::result::Result<u64, String> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (digits, unit) = trimmed.split_at(split);
    let number: u64 = digits.parse().map_err(|_| {
        format!("{text:?} is not a size: write a number of bytes (134217728) or one with a unit (\"128MB\")")
    })?;
    let factor: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        other => {
            return Err(format!(
                "unknown unit {other:?} in {text:?}: use B, KB, MB or GB (powers of 1024)"
            ));
        }
    };
    number
        .checked_mul(factor)
        .ok_or_else(|| format!("{text:?} is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(target: u64, min: usize) -> CompactPolicy {
        CompactPolicy {
            target_file_size: target,
            min_input_files: min,
        }
    }

    #[test]
    fn sizes_parse_with_and_without_units() {
        assert_eq!(parse_byte_size("128MB"), Ok(128 << 20));
        assert_eq!(parse_byte_size("64 KiB"), Ok(64 << 10));
        assert_eq!(parse_byte_size("1g"), Ok(1 << 30));
        assert_eq!(parse_byte_size("4096"), Ok(4096));
        assert!(
            parse_byte_size("12 parsecs")
                .unwrap_err()
                .contains("unknown unit")
        );
        assert!(parse_byte_size("MB").unwrap_err().contains("not a size"));
        let parsed: CompactPolicy = toml::from_str("target_file_size = \"2MB\"").unwrap();
        assert_eq!(parsed, policy(2 << 20, DEFAULT_COMPACT_MIN_INPUT_FILES));
        let parsed: CompactPolicy =
            toml::from_str("target_file_size = 4096\nmin_input_files = 3").unwrap();
        assert_eq!(parsed, policy(4096, 3));
        assert!(toml::from_str::<CompactPolicy>("min_files = 3").is_err());
    }

    #[test]
    fn a_policy_below_two_files_or_a_kilobyte_or_with_an_upsert_key_is_refused_naming_the_key() {
        let sink = SinkId::new("lake").unwrap();
        let err = policy(1 << 20, 1)
            .check(&sink, &[])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("min_input_files = 1") && err.contains("lake"),
            "{err}"
        );
        let err = policy(100, 4).check(&sink, &[]).unwrap_err().to_string();
        assert!(err.contains("target_file_size = 100"), "{err}");
        let err = policy(1 << 20, 2)
            .check(&sink, &["id".to_string()])
            .unwrap_err()
            .to_string();
        assert!(err.contains("append tables only"), "{err}");
        policy(1 << 20, 2).check(&sink, &[]).unwrap();
    }

    #[test]
    fn files_at_or_above_three_quarters_of_the_target_are_not_small() {
        assert_eq!(policy(4000, 2).small_below(), 3000);
    }
}
