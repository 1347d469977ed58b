//! Which message a Confluent-framed Protobuf value holds: its message-index path, and the message it names in the
//! writer's compiled file ([`schema_registry::protobuf::compile`]).

use prost_reflect::{FileDescriptor, MessageDescriptor};

/// The message index path of a Confluent-framed Protobuf value (after the 5-byte id) and the body after it: a
/// zigzag varint count, then that many zigzag varint indexes; a count of 0 is the path `[0]`.
///
/// # Errors
/// Why the path cannot be read, as the end of a sentence.
pub(crate) fn message_indexes(framed: &[u8]) -> Result<(Vec<usize>, &[u8]), String> {
    let mut rest = framed;
    let count = zigzag(&mut rest)?;
    if count == 0 {
        return Ok((vec![0], rest));
    }
    if !(1..=64).contains(&count) {
        return Err(format!(
            "has a message-index path of {count} entries (the wire format's count is at most 64 here)"
        ));
    }
    let mut indexes = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let index = zigzag(&mut rest)?;
        let index = usize::try_from(index)
            .map_err(|_| format!("has a negative message index ({index})"))?;
        indexes.push(index);
    }
    Ok((indexes, rest))
}

/// One zigzag-encoded varint (at most 32 bits, as Kafka's `ByteUtils.readVarint`) off the front of `rest`.
fn zigzag(rest: &mut &[u8]) -> Result<i64, String> {
    let mut value: u64 = 0;
    for (i, byte) in rest.iter().enumerate().take(5) {
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            *rest = &rest[i + 1..];
            return Ok((value >> 1) as i64 ^ -((value & 1) as i64));
        }
    }
    Err("has a message-index path that is cut short or not a varint".into())
}

/// The message `indexes` names in `file`: the first index a top-level message, each later one a nested message
/// of the one before (map entries count, in declaration order).
///
/// # Errors
/// An index past the messages there, as the end of a sentence.
pub(crate) fn message_at(
    file: &FileDescriptor,
    indexes: &[usize],
) -> Result<MessageDescriptor, String> {
    let past = |index: usize, within: &str| {
        format!("names message index {index} of {within}, which has no such message")
    };
    let (first, nested) = indexes.split_first().unwrap_or((&0, &[]));
    let mut message = file
        .messages()
        .nth(*first)
        .ok_or_else(|| past(*first, &format!("file {}", file.name())))?;
    for index in nested {
        let child = message.child_messages().nth(*index);
        message = child.ok_or_else(|| past(*index, message.full_name()))?;
    }
    Ok(message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_index_paths_read_as_kafka_writes_them() {
        assert_eq!(message_indexes(&[0, 9]).unwrap(), (vec![0], &[9][..]));
        // [1, 0] is written 02 02 00 (count 1 and index 1 zigzag-encoded as 2).
        assert_eq!(
            message_indexes(&[4, 2, 0, 9]).unwrap(),
            (vec![1, 0], &[9][..])
        );
        assert!(message_indexes(&[]).unwrap_err().contains("cut short"));
        assert!(message_indexes(&[1]).unwrap_err().contains("-1 entries"));
    }

    #[tokio::test]
    async fn paths_name_top_level_then_nested_messages_map_entries_included() {
        let registry = schema_registry::SchemaRegistry::new(
            &schema_registry::RegistrySettings::new("http://127.0.0.1:9/"),
        )
        .unwrap();
        let schema = schema_registry::RegisteredSchema {
            id: 3,
            schema: r#"syntax = "proto3"; package shop;
                message Order { int64 id = 1; message Line { string sku = 1; } repeated Line lines = 3;
                                map<string, int64> tags = 4; }
                message Refund { int64 order = 1; }"#
                .to_string(),
            schema_type: schema_registry::SchemaType::Protobuf,
            references: Vec::new(),
            version: None,
        };
        let file = schema_registry::protobuf::compile(&registry, &schema)
            .await
            .unwrap();
        assert_eq!(message_at(&file, &[0]).unwrap().full_name(), "shop.Order");
        assert_eq!(message_at(&file, &[1]).unwrap().full_name(), "shop.Refund");
        assert_eq!(
            message_at(&file, &[0, 0]).unwrap().full_name(),
            "shop.Order.Line"
        );
        assert_eq!(
            message_at(&file, &[0, 1]).unwrap().full_name(),
            "shop.Order.TagsEntry"
        );
        assert!(message_at(&file, &[2]).unwrap_err().contains("index 2"));
    }
}
