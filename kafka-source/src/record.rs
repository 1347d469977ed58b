//! One record as the builders take it: where it is from (for error messages) and its parts.

use connector_api::{Error, ErrorKind, Phase, Result};

/// Where a record came from, for error messages.
#[derive(Clone, Copy)]
pub(crate) struct RecordAt<'a> {
    pub(crate) topic: &'a str,
    pub(crate) partition: i32,
    pub(crate) offset: i64,
}

/// A [`BadRecord`](ErrorKind::BadRecord) naming the record at `at` and what is wrong with it.
pub(crate) fn bad_record(at: RecordAt<'_>, what: &str) -> Error {
    Error::new(
        ErrorKind::BadRecord,
        Phase::Write,
        format!("record {}/{}@{} {what}", at.topic, at.partition, at.offset),
    )
}

/// `bytes` as UTF-8, or a [`BadRecord`](ErrorKind::BadRecord) naming the record and `what`.
pub(crate) fn text<'b>(
    at: RecordAt<'_>,
    bytes: Option<&'b [u8]>,
    what: &str,
) -> Result<Option<&'b str>> {
    bytes
        .map(std::str::from_utf8)
        .transpose()
        .map_err(|e| bad_record(at, &format!("has a {what} that is not UTF-8")).with_source(e))
}

/// One record as the builders take it: where it is from, its timestamp (milliseconds), key, value and headers.
pub(crate) struct RecordParts<'a, H> {
    pub(crate) at: RecordAt<'a>,
    pub(crate) timestamp: Option<i64>,
    pub(crate) key: Option<&'a [u8]>,
    pub(crate) value: Option<&'a [u8]>,
    pub(crate) headers: Option<&'a H>,
}
