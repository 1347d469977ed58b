//! Where data files go, and comparing locations: the two places where a path written into a manifest and the same
//! file as storage lists it can differ in spelling.
//!
//! - Writing: like iceberg-rust's default generator (`write.data.path`, or `<table location>/data`), but every
//!   partition value is escaped as Iceberg's Java implementation escapes it (`application/x-www-form-urlencoded`:
//!   `a/b c` becomes `a%2Fb+c`), so a string value holding `/` is one directory level, never several or an empty
//!   one.
//! - Comparing: [`canonical`] collapses repeated `/` after the scheme. A table whose location was derived from a
//!   warehouse ending in `/` records `wh//ns/t/...` in its manifests while storage (OpenDAL normalises every path)
//!   lists `wh/ns/t/...`, and files written before values were escaped may hold `//` inside; both name the same
//!   object.

use iceberg::spec::{PartitionKey, TableMetadata};
use iceberg::writer::file_writer::location_generator::LocationGenerator;

/// Table property naming the data directory (as iceberg-rust and Java read it).
const WRITE_DATA_LOCATION: &str = "write.data.path";
/// Older name of the same property.
const WRITE_FOLDER_STORAGE_LOCATION: &str = "write.folder-storage.path";

/// `location` in one spelling: the scheme (`file://`, `s3://`) kept, every run of `/` after it collapsed to one.
pub fn canonical(location: &str) -> String {
    let (scheme, rest) = match location.split_once("://") {
        Some((scheme, rest)) => (format!("{scheme}://"), rest),
        None => (String::new(), location),
    };
    // `file:///x` keeps the leading `/` of its absolute path.
    let mut out = scheme;
    let mut previous_slash = false;
    for c in rest.chars() {
        if c == '/' && previous_slash {
            continue;
        }
        previous_slash = c == '/';
        out.push(c);
    }
    out
}

/// The table's data directory, without a trailing `/`.
pub fn data_location(metadata: &TableMetadata) -> String {
    let properties = metadata.properties();
    let location = properties
        .get(WRITE_DATA_LOCATION)
        .or_else(|| properties.get(WRITE_FOLDER_STORAGE_LOCATION))
        .cloned()
        .unwrap_or_else(|| format!("{}/data", metadata.location().trim_end_matches('/')));
    location.trim_end_matches('/').to_string()
}

/// A partition value as a path segment: escaped like Java's `URLEncoder` (letters, digits and `.-*_` stay, a space
/// becomes `+`, every other byte `%XX`).
pub fn escape(value: &str) -> String {
    url::form_urlencoded::byte_serialize(value.as_bytes()).collect()
}

/// Data file locations with escaped partition values (see the module docs).
#[derive(Debug, Clone)]
pub struct EscapedLocations {
    data_location: String,
}

impl EscapedLocations {
    /// The generator of `metadata`'s table.
    pub fn new(metadata: &TableMetadata) -> Self {
        Self {
            data_location: data_location(metadata),
        }
    }
}

impl LocationGenerator for EscapedLocations {
    fn generate_location(&self, partition_key: Option<&PartitionKey>, file_name: &str) -> String {
        let Some(key) = partition_key.filter(|k| !PartitionKey::is_effectively_none(Some(k)))
        else {
            return format!("{}/{file_name}", self.data_location);
        };
        let spec = key.spec();
        // The key was built for this spec and schema by the writer, so its partition type exists.
        let path = match spec.partition_type(key.schema()) {
            Ok(partition_type) => spec
                .fields()
                .iter()
                .zip(partition_type.fields())
                .enumerate()
                .map(|(i, (field, typed))| {
                    let value = field
                        .transform
                        .to_human_string(&typed.field_type, key.data()[i].as_ref());
                    format!("{}={}", field.name, escape(&value))
                })
                .collect::<Vec<_>>()
                .join("/"),
            Err(_) => key.to_path(),
        };
        format!("{}/{path}/{file_name}", self.data_location)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_warehouse_ending_in_a_slash_and_the_listed_file_are_one_location() {
        assert_eq!(
            canonical("file:///tmp/wh//ns/t/data/ratchet.j.s.0.e1.c2-00000.parquet"),
            "file:///tmp/wh/ns/t/data/ratchet.j.s.0.e1.c2-00000.parquet"
        );
        assert_eq!(
            canonical("file:///tmp/wh/ns/t/data/x.parquet"),
            "file:///tmp/wh/ns/t/data/x.parquet"
        );
    }

    #[test]
    fn s3_locations_keep_bucket_and_collapse_repeated_slashes() {
        assert_eq!(
            canonical("s3://bucket/wh//ns/t/data/x.parquet"),
            "s3://bucket/wh/ns/t/data/x.parquet"
        );
        assert_eq!(canonical("s3a://bucket///x"), "s3a://bucket/x");
    }

    #[test]
    fn partition_values_with_slashes_written_unescaped_compare_equal_to_their_listing() {
        // `p=a//b` and `p=abc/` (a value ending in `/`) as an older writer spelt them, and as storage lists them.
        assert_eq!(
            canonical("file:///wh/t/data/p=a//b/x.parquet"),
            canonical("file:///wh/t/data/p=a/b/x.parquet")
        );
        assert_eq!(
            canonical("file:///wh/t/data/p=abc//x.parquet"),
            "file:///wh/t/data/p=abc/x.parquet"
        );
    }

    #[test]
    fn partition_values_are_escaped_into_one_segment() {
        assert_eq!(escape("a/b c"), "a%2Fb+c");
        assert_eq!(escape("a//b"), "a%2F%2Fb");
        assert_eq!(escape("abc/"), "abc%2F");
        assert_eq!(escape("100%"), "100%25");
        assert_eq!(escape("2026-12-01"), "2026-12-01");
        assert_eq!(escape("null"), "null");
        assert!(!escape("../x").contains('/'));
    }

    #[test]
    fn a_path_without_a_scheme_is_collapsed_too() {
        assert_eq!(canonical("/wh//t"), "/wh/t");
    }
}
