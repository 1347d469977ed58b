//! A registered Protobuf schema made a descriptor: the schema and the schemas its references name (its imports,
//! fetched by subject and version, recursively), compiled with protox (no `protoc`), the well-known
//! `google/protobuf/*.proto` files supplied as compiled in; and the message a record's message-index path names.
//!
//! A registry returns a Protobuf schema as `.proto` text (what Confluent's Java serializers register) or as a
//! base64 `FileDescriptorProto` (what confluent-kafka-python's `ProtobufSerializer` registers, kept as such by
//! Apicurio); both are read.

use std::collections::HashMap;

use base64::Engine;
use prost_reflect::prost::Message;
use prost_reflect::{FileDescriptor, MessageDescriptor, prost_types};
use protox::file::{ChainFileResolver, File, FileResolver, GoogleFileResolver};
use schema_registry::{RegisteredSchema, RegistryError, SchemaRegistry};

/// How many files one schema may pull in through its references (a cycle or a runaway chain stops there).
const MAX_REFERENCED_FILES: usize = 256;

/// Why a registered schema gives no descriptor.
#[derive(Debug)]
pub(crate) enum SchemaFileError {
    /// The registry could not be asked for a referenced schema (or did not have it).
    Registry {
        subject: String,
        source: RegistryError,
    },
    /// The schema or a referenced one is not a Protobuf file that compiles; why, as the end of a sentence.
    Invalid(String),
}

impl std::fmt::Display for SchemaFileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Registry { subject, source } => {
                write!(
                    f,
                    "its reference to subject {subject} cannot be fetched: {source}"
                )
            }
            Self::Invalid(why) => f.write_str(why),
        }
    }
}

/// The file of `schema`, with every file its references name, fetched from `registry`.
///
/// # Errors
/// [`SchemaFileError::Registry`] when a reference cannot be fetched; [`SchemaFileError::Invalid`] when a file is
/// neither `.proto` text nor a base64 descriptor, does not compile, or the references run past
/// [`MAX_REFERENCED_FILES`].
pub(crate) async fn compile(
    registry: &SchemaRegistry,
    schema: &RegisteredSchema,
) -> Result<FileDescriptor, SchemaFileError> {
    let root = file_of(&schema.schema, None, &format!("schema-{}.proto", schema.id))?;
    let root_name = root.name().to_string();
    let mut files = HashMap::from([(root_name.clone(), root)]);
    let mut pending = schema.references.clone();
    while let Some(reference) = pending.pop() {
        if files.contains_key(&reference.name) {
            continue;
        }
        if files.len() >= MAX_REFERENCED_FILES {
            return Err(SchemaFileError::Invalid(format!(
                "its references name more than {MAX_REFERENCED_FILES} files"
            )));
        }
        let referenced = registry
            .version(&reference.subject, &reference.version.to_string())
            .await
            .map_err(|source| SchemaFileError::Registry {
                subject: format!("{} (version {})", reference.subject, reference.version),
                source,
            })?;
        let file = file_of(&referenced.schema, Some(&reference.name), &reference.name)?;
        files.insert(reference.name.clone(), file);
        pending.extend(referenced.references);
    }
    let mut resolver = ChainFileResolver::new();
    resolver.add(RegistryFiles(files));
    resolver.add(GoogleFileResolver::new());
    let mut compiler = protox::Compiler::with_file_resolver(resolver);
    compiler.include_imports(true);
    compiler
        .open_file(&root_name)
        .map_err(|e| SchemaFileError::Invalid(format!("it does not compile: {e}")))?;
    compiler
        .descriptor_pool()
        .get_file_by_name(&root_name)
        .ok_or_else(|| SchemaFileError::Invalid("its file is missing after compiling".into()))
}

/// The file of one registered schema text: a base64 `FileDescriptorProto` (named `import` when a reference
/// imports it under that name) or `.proto` source named `name`.
fn file_of(text: &str, import: Option<&str>, name: &str) -> Result<File, SchemaFileError> {
    if let Some(mut descriptor) = descriptor_of(text) {
        if let Some(import) = import {
            descriptor.name = Some(import.to_string());
        } else if descriptor.name.as_deref().is_none_or(str::is_empty) {
            descriptor.name = Some(name.to_string());
        }
        return Ok(File::from_file_descriptor_proto(descriptor));
    }
    File::from_source(name, text)
        .map_err(|e| SchemaFileError::Invalid(format!("`{name}` is not Protobuf source: {e}")))
}

/// `text` as a base64 `FileDescriptorProto`, when it is one.
fn descriptor_of(text: &str) -> Option<prost_types::FileDescriptorProto> {
    let text = text.trim();
    if text.is_empty() || text.contains(|c: char| c.is_whitespace() || c == ';') {
        return None;
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .ok()?;
    prost_types::FileDescriptorProto::decode(bytes.as_slice()).ok()
}

/// The files fetched from the registry, by the names imports use.
struct RegistryFiles(HashMap<String, File>);

impl FileResolver for RegistryFiles {
    fn open_file(&self, name: &str) -> Result<File, protox::Error> {
        self.0
            .get(name)
            .cloned()
            .ok_or_else(|| protox::Error::file_not_found(name))
    }
}

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

    const ORDERS: &str = r#"syntax = "proto3";
        package shop;
        import "google/protobuf/timestamp.proto";
        message Order { int64 id = 1; google.protobuf.Timestamp at = 2;
                        message Line { string sku = 1; } repeated Line lines = 3; map<string, int64> tags = 4; }
        message Refund { int64 order = 1; }"#;

    fn registered(schema: &str) -> RegisteredSchema {
        RegisteredSchema {
            id: 3,
            schema: schema.to_string(),
            schema_type: schema_registry::SchemaType::Protobuf,
            references: Vec::new(),
            version: None,
        }
    }

    fn registry() -> SchemaRegistry {
        SchemaRegistry::new(&schema_registry::RegistrySettings::new(
            "http://127.0.0.1:9/",
        ))
        .unwrap()
    }

    #[tokio::test]
    async fn proto_text_and_base64_descriptors_compile_to_the_same_messages() {
        let file = compile(&registry(), &registered(ORDERS)).await.unwrap();
        assert_eq!(message_at(&file, &[0]).unwrap().full_name(), "shop.Order");
        assert_eq!(message_at(&file, &[1]).unwrap().full_name(), "shop.Refund");
        assert_eq!(
            message_at(&file, &[0, 0]).unwrap().full_name(),
            "shop.Order.Line"
        );
        // The map's entry type is the second nested message.
        assert_eq!(
            message_at(&file, &[0, 1]).unwrap().full_name(),
            "shop.Order.TagsEntry"
        );
        assert!(message_at(&file, &[2]).unwrap_err().contains("index 2"));
        let encoded = base64::engine::general_purpose::STANDARD
            .encode(file.file_descriptor_proto().encode_to_vec());
        let again = compile(&registry(), &registered(&encoded)).await.unwrap();
        assert_eq!(
            message_at(&again, &[0]).unwrap().fields().count(),
            message_at(&file, &[0]).unwrap().fields().count()
        );
    }

    #[tokio::test]
    async fn a_schema_that_does_not_compile_is_refused_naming_why() {
        let why = compile(
            &registry(),
            &registered(r#"syntax = "proto3"; message A { strin a = 1; }"#),
        )
        .await
        .unwrap_err()
        .to_string();
        assert!(why.contains("strin"), "{why}");
    }
}
