//! The job file's `compact` setting of the Iceberg sink (`compact = { target_file_size = "128MB",
//! min_input_files = 8 }`, `compact = true`, `compact = false`, or nothing): its keys, their defaults, which
//! tables compact when it is left out, and the checks `check-config` and the sink's start run. What it drives:
//! [`crate::compaction`].

use std::fmt;

use connector_api::{Error, Result, SinkId};
use iceberg::table::Table;
use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

use crate::upsert_deletes::UpsertDeletes;

/// The table property the sink sets on a table it creates (`create_table`), naming the job: such a table
/// compacts by default ([`Compact::Default`]).
pub const CREATED_BY_PROPERTY: &str = "ratchet.created-by";

/// The job file's `compact` setting.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Compact {
    /// Left out: a table the sink created ([`CREATED_BY_PROPERTY`]), appended or upserted by position deletes or
    /// deletion vectors, compacts with the default [`CompactPolicy`]; any other table (created by someone else,
    /// before that property existed, or upserted by equality deletes) compacts nothing.
    #[default]
    Default,
    /// `compact = false`: no compaction.
    Off,
    /// `compact = true` (the default policy) or `compact = { ... }`: compaction, refused where the sink cannot
    /// compact ([`CompactPolicy::check`]).
    On(CompactPolicy),
}

impl Compact {
    /// The policy the sink compacts `table` with (`None`: no compaction); `upsert` the upsert mode's deletes
    /// (`None`: an append table).
    pub fn resolve(&self, table: &Table, upsert: Option<UpsertDeletes>) -> Option<CompactPolicy> {
        self.resolve_for(
            table
                .metadata()
                .properties()
                .contains_key(CREATED_BY_PROPERTY),
            upsert,
        )
    }

    /// The policy the sink will compact a table with that it creates on its first run.
    pub(crate) fn resolve_created(&self, upsert: Option<UpsertDeletes>) -> Option<CompactPolicy> {
        self.resolve_for(true, upsert)
    }

    fn resolve_for(
        &self,
        created_by_ratchet: bool,
        upsert: Option<UpsertDeletes>,
    ) -> Option<CompactPolicy> {
        match self {
            Compact::Off => None,
            Compact::On(policy) => Some(*policy),
            Compact::Default => (created_by_ratchet && upsert != Some(UpsertDeletes::Equality))
                .then(CompactPolicy::default),
        }
    }

    /// The policy the job file sets explicitly (`None` for [`Compact::Default`] and [`Compact::Off`]): what
    /// `check-config` and the start check before the table is known.
    pub fn explicit(&self) -> Option<&CompactPolicy> {
        match self {
            Compact::On(policy) => Some(policy),
            Compact::Default | Compact::Off => None,
        }
    }
}

impl<'de> Deserialize<'de> for Compact {
    /// `true`, `false`, or the policy's table (whose own errors name its keys).
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        struct CompactVisitor;
        impl<'de> Visitor<'de> for CompactVisitor {
            type Value = Compact;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(
                    "true, false, or a table such as { target_file_size = \"128MB\", min_input_files = 8 }",
                )
            }

            fn visit_bool<E: serde::de::Error>(self, on: bool) -> std::result::Result<Compact, E> {
                Ok(match on {
                    true => Compact::On(CompactPolicy::default()),
                    false => Compact::Off,
                })
            }

            fn visit_map<A: MapAccess<'de>>(
                self,
                map: A,
            ) -> std::result::Result<Compact, A::Error> {
                CompactPolicy::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(Compact::On)
            }
        }
        deserializer.deserialize_any(CompactVisitor)
    }
}

/// The default `compact.target_file_size`: 128 MiB, Iceberg's `write.target-file-size-bytes`.
pub const DEFAULT_COMPACT_TARGET_FILE_SIZE: u64 = 128 << 20;
/// The default `compact.min_input_files`: Iceberg's `rewrite_data_files` default `min-input-files` is 5; 8 keeps
/// the write amplification of 1 s checkpoints lower.
pub const DEFAULT_COMPACT_MIN_INPUT_FILES: usize = 8;
/// The default `compact.delete_ratio_threshold`: Iceberg's `rewrite_data_files` default `delete-ratio-threshold`.
pub const DEFAULT_COMPACT_DELETE_RATIO_THRESHOLD: f64 = 0.3;
/// The default `compact.delete_file_threshold`. Iceberg's `rewrite_data_files` leaves it unbounded; a sink's
/// position-delete upserts add one delete file per checkpoint naming the files whose keys they replace, and every
/// reader opens each for the data file it names (an hour of them at 1 s made Spark's scan 227x slower), so the
/// sink bounds it.
pub const DEFAULT_COMPACT_DELETE_FILE_THRESHOLD: usize = 16;

/// The job file's `compact` policy.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompactPolicy {
    /// The size a rewritten file aims at, in bytes or with a unit (`"128MB"`: powers of 1024, as Spark reads
    /// them); files under ¾ of it are small.
    #[serde(default = "default_target_file_size", deserialize_with = "byte_size")]
    pub target_file_size: u64,
    /// How many small files of one partition and size tier a rewrite waits for (at least 2).
    #[serde(default = "default_min_input_files")]
    pub min_input_files: usize,
    /// The share of a file's rows deleted (0 to 1) from which a file of any size is rewritten without them
    /// (Iceberg's `delete-ratio-threshold`): one such file per look, besides the small files' groups.
    #[serde(default = "default_delete_ratio_threshold")]
    pub delete_ratio_threshold: f64,
    /// How many delete files may name a data file before it is rewritten without its deleted rows, whatever their
    /// share (Iceberg's `delete-file-threshold`; at least 1): one such file per look, as above.
    #[serde(default = "default_delete_file_threshold")]
    pub delete_file_threshold: usize,
}

impl Default for CompactPolicy {
    fn default() -> Self {
        Self {
            target_file_size: DEFAULT_COMPACT_TARGET_FILE_SIZE,
            min_input_files: DEFAULT_COMPACT_MIN_INPUT_FILES,
            delete_ratio_threshold: DEFAULT_COMPACT_DELETE_RATIO_THRESHOLD,
            delete_file_threshold: DEFAULT_COMPACT_DELETE_FILE_THRESHOLD,
        }
    }
}

fn default_target_file_size() -> u64 {
    DEFAULT_COMPACT_TARGET_FILE_SIZE
}

fn default_min_input_files() -> usize {
    DEFAULT_COMPACT_MIN_INPUT_FILES
}

fn default_delete_ratio_threshold() -> f64 {
    DEFAULT_COMPACT_DELETE_RATIO_THRESHOLD
}

fn default_delete_file_threshold() -> usize {
    DEFAULT_COMPACT_DELETE_FILE_THRESHOLD
}

impl CompactPolicy {
    /// Checks the policy of sink `sink`, whose rows are upserted by `upsert_key` (empty: appended) with `deletes`.
    ///
    /// # Errors
    /// [`Config`](connector_api::ErrorKind::Config) naming the key: `min_input_files` below 2, `target_file_size` below 1 KiB,
    /// `delete_ratio_threshold` outside (0, 1], `delete_file_threshold` 0, or an upsert table written with `upsert_deletes = "equality"` (the rewrite applies position deletes only,
    /// and the key index that tracks moved rows exists only in the position mode).
    pub fn check(
        &self,
        sink: &SinkId,
        upsert_key: &[String],
        deletes: UpsertDeletes,
    ) -> Result<()> {
        let refuse = |why: String| Err(Error::config(format!("sink {sink}: compact: {why}")));
        if !upsert_key.is_empty() && deletes == UpsertDeletes::Equality {
            return refuse(
                "the sink compacts upsert tables written with upsert_deletes = \"position\" (the default) only: \
                 a rewrite must apply the table's deletes and move the key index's rows, and with equality \
                 deletes there is no key index. Remove `compact` or `upsert_deletes`, or compact the table with \
                 Spark's rewrite_data_files beside the sink (docs/worker.md, \"Maintaining a table with \
                 Spark\")"
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
        let ratio = self.delete_ratio_threshold;
        if !(ratio > 0.0 && ratio <= 1.0) {
            return refuse(format!(
                "delete_ratio_threshold = {ratio} is not a share of a file's rows: use a number above 0 and at \
                 most 1 (the default is {DEFAULT_COMPACT_DELETE_RATIO_THRESHOLD}: a file with 30% of its rows \
                 deleted is rewritten)"
            ));
        }
        if self.delete_file_threshold == 0 {
            return refuse(format!(
                "delete_file_threshold = 0 would rewrite every file at every look: use 1 or more (the default is \
                 {DEFAULT_COMPACT_DELETE_FILE_THRESHOLD}: a file that {DEFAULT_COMPACT_DELETE_FILE_THRESHOLD} \
                 delete files name is rewritten)"
            ));
        }
        Ok(())
    }

    /// The policy as the job file would write it, for `check-config`'s summary.
    pub(crate) fn describe(&self) -> String {
        let size = self.target_file_size;
        let target = [(30, "GB"), (20, "MB"), (10, "KB")]
            .iter()
            .find(|(shift, _)| size.is_multiple_of(1 << shift))
            .map_or(format!("{size}"), |(shift, unit)| {
                format!("\"{}{unit}\"", size >> shift)
            });
        format!(
            "target_file_size = {target}, min_input_files = {}, delete_ratio_threshold = {}, \
             delete_file_threshold = {}",
            self.min_input_files, self.delete_ratio_threshold, self.delete_file_threshold
        )
    }

    /// Files at or above this size are not small.
    pub(crate) fn small_below(&self) -> u64 {
        self.target_file_size / 4 * 3
    }

    /// Whether a file of `rows` rows of which `deleted` are deleted, by `delete_files` delete files, is due for a
    /// rewrite without them.
    pub(crate) fn deletes_due(&self, rows: u64, deleted: u64, delete_files: usize) -> bool {
        rows > 0
            && deleted > 0
            && (deleted as f64 >= self.delete_ratio_threshold * rows as f64
                || delete_files >= self.delete_file_threshold)
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
            ..CompactPolicy::default()
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
    fn a_policy_below_two_files_or_a_kilobyte_or_on_equality_upserts_is_refused_naming_the_key() {
        let sink = SinkId::new("lake").unwrap();
        let err = policy(1 << 20, 1)
            .check(&sink, &[], POSITION)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("min_input_files = 1") && err.contains("lake"),
            "{err}"
        );
        let err = policy(100, 4)
            .check(&sink, &[], POSITION)
            .unwrap_err()
            .to_string();
        assert!(err.contains("target_file_size = 100"), "{err}");
        for ratio in [0.0, 1.5, f64::NAN] {
            let err = CompactPolicy {
                delete_ratio_threshold: ratio,
                ..policy(1 << 20, 2)
            }
            .check(&sink, &[], POSITION)
            .unwrap_err()
            .to_string();
            assert!(err.contains("delete_ratio_threshold"), "{err}");
        }
        let err = CompactPolicy {
            delete_file_threshold: 0,
            ..policy(1 << 20, 2)
        }
        .check(&sink, &[], POSITION)
        .unwrap_err()
        .to_string();
        assert!(err.contains("delete_file_threshold = 0"), "{err}");
        let key = ["id".to_string()];
        let err = policy(1 << 20, 2)
            .check(&sink, &key, UpsertDeletes::Equality)
            .unwrap_err()
            .to_string();
        assert!(err.contains("upsert_deletes = \"position\""), "{err}");
        policy(1 << 20, 2).check(&sink, &key, POSITION).unwrap();
        policy(1 << 20, 2).check(&sink, &[], POSITION).unwrap();
    }

    const POSITION: UpsertDeletes = UpsertDeletes::Position;

    #[derive(Debug, Deserialize)]
    struct Entry {
        #[serde(default)]
        compact: Compact,
    }

    fn entry(text: &str) -> std::result::Result<Compact, String> {
        toml::from_str::<Entry>(text)
            .map(|e| e.compact)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn compact_is_a_flag_a_policy_or_left_out() {
        assert_eq!(entry(""), Ok(Compact::Default));
        assert_eq!(entry("compact = false"), Ok(Compact::Off));
        assert_eq!(
            entry("compact = true"),
            Ok(Compact::On(CompactPolicy::default()))
        );
        assert_eq!(
            entry("compact = { min_input_files = 3 }"),
            Ok(Compact::On(policy(DEFAULT_COMPACT_TARGET_FILE_SIZE, 3)))
        );
        let err = entry("compact = { min_files = 3 }").unwrap_err();
        assert!(err.contains("min_files"), "{err}");
        let err = entry("compact = \"yes\"").unwrap_err();
        assert!(err.contains("true, false, or a table"), "{err}");
    }

    #[test]
    fn left_out_compact_compacts_only_tables_the_sink_created_without_equality_deletes() {
        let (position, equality) = (Some(UpsertDeletes::Position), Some(UpsertDeletes::Equality));
        let default = Some(CompactPolicy::default());
        let left_out = Compact::Default;
        assert_eq!(left_out.resolve_for(true, None), default);
        assert_eq!(left_out.resolve_for(true, position), default);
        assert_eq!(left_out.resolve_for(false, None), None);
        assert_eq!(left_out.resolve_for(false, position), None);
        assert_eq!(left_out.resolve_for(true, equality), None);
        assert_eq!(Compact::Off.resolve_for(true, None), None);
        let set = Compact::On(policy(4096, 3));
        assert_eq!(set.resolve_for(false, None), Some(policy(4096, 3)));
    }

    #[test]
    fn a_policy_describes_itself_as_the_job_file_writes_it() {
        assert_eq!(
            CompactPolicy::default().describe(),
            "target_file_size = \"128MB\", min_input_files = 8, delete_ratio_threshold = 0.3, delete_file_threshold = 16"
        );
        assert_eq!(
            policy(4096, 2).describe(),
            "target_file_size = \"4KB\", min_input_files = 2, delete_ratio_threshold = 0.3, delete_file_threshold = 16"
        );
        assert_eq!(
            policy(5000, 2).describe(),
            "target_file_size = 5000, min_input_files = 2, delete_ratio_threshold = 0.3, delete_file_threshold = 16"
        );
    }

    #[test]
    fn files_at_or_above_three_quarters_of_the_target_are_not_small() {
        assert_eq!(policy(4000, 2).small_below(), 3000);
    }

    #[test]
    fn a_file_is_due_for_its_deletes_from_either_threshold_on() {
        let policy = policy(4096, 2);
        assert!(!policy.deletes_due(10, 2, 1));
        assert!(policy.deletes_due(10, 3, 1));
        assert!(policy.deletes_due(10, 10, 1));
        assert!(!policy.deletes_due(0, 0, 0));
        // Many delete files, few rows deleted: due from the file threshold on.
        assert!(!policy.deletes_due(1000, 15, 15));
        assert!(policy.deletes_due(1000, 16, 16));
        let parsed: CompactPolicy =
            toml::from_str("delete_ratio_threshold = 0.5\ndelete_file_threshold = 3").unwrap();
        assert!(!parsed.deletes_due(10, 4, 2) && parsed.deletes_due(10, 5, 1));
        assert!(parsed.deletes_due(100, 3, 3));
    }
}
