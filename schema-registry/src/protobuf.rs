//! A registered Protobuf schema made a descriptor: the schema and the schemas its references name (its imports,
//! fetched by subject and version, recursively), compiled with protox (no `protoc`), the well-known
//! `google/protobuf/*.proto` files supplied as compiled in.
//!
//! A registry returns a Protobuf schema as `.proto` text (what Confluent's Java serializers register) or as a
//! base64 `FileDescriptorProto` (what confluent-kafka-python's `ProtobufSerializer` registers, kept as such by
//! Apicurio); both are read.

use std::collections::HashMap;

use crate::{RegisteredSchema, RegistryError, SchemaRegistry};
use base64::Engine;
use prost_reflect::prost::Message;
use prost_reflect::{FileDescriptor, prost_types};
use protox::file::{ChainFileResolver, File, FileResolver, GoogleFileResolver};

/// How many files one schema may pull in through its references (a cycle or a runaway chain stops there).
const MAX_REFERENCED_FILES: usize = 256;

/// Why a registered schema gives no descriptor.
#[derive(Debug)]
#[non_exhaustive]
pub enum ProtobufSchemaError {
    /// The registry could not be asked for a referenced schema (or did not have it).
    Registry {
        /// The subject and version of the reference.
        subject: String,
        /// Why it could not be fetched.
        source: RegistryError,
    },
    /// The schema or a referenced one is not a Protobuf file that compiles; why, as the end of a sentence.
    Invalid(String),
}

impl std::fmt::Display for ProtobufSchemaError {
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

impl std::error::Error for ProtobufSchemaError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Registry { source, .. } => Some(source),
            Self::Invalid(_) => None,
        }
    }
}

/// The file of `schema`, with every file its references name, fetched from `registry`.
///
/// # Errors
/// [`ProtobufSchemaError::Registry`] when a reference cannot be fetched; [`ProtobufSchemaError::Invalid`] when a file is
/// neither `.proto` text nor a base64 descriptor, does not compile, or the references run past
/// `MAX_REFERENCED_FILES` (256).
pub async fn compile(
    registry: &SchemaRegistry,
    schema: &RegisteredSchema,
) -> Result<FileDescriptor, ProtobufSchemaError> {
    let root = file_of(&schema.schema, None, &format!("schema-{}.proto", schema.id))?;
    let root_name = root.name().to_string();
    let mut files = HashMap::from([(root_name.clone(), root)]);
    let mut pending = schema.references.clone();
    while let Some(reference) = pending.pop() {
        if files.contains_key(&reference.name) {
            continue;
        }
        if files.len() >= MAX_REFERENCED_FILES {
            return Err(ProtobufSchemaError::Invalid(format!(
                "its references name more than {MAX_REFERENCED_FILES} files"
            )));
        }
        let referenced = registry
            .version(&reference.subject, &reference.version.to_string())
            .await
            .map_err(|source| ProtobufSchemaError::Registry {
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
        .map_err(|e| ProtobufSchemaError::Invalid(format!("it does not compile: {e}")))?;
    compiler
        .descriptor_pool()
        .get_file_by_name(&root_name)
        .ok_or_else(|| ProtobufSchemaError::Invalid("its file is missing after compiling".into()))
}

/// The file of one registered schema text: a base64 `FileDescriptorProto` (named `import` when a reference
/// imports it under that name) or `.proto` source named `name`.
fn file_of(text: &str, import: Option<&str>, name: &str) -> Result<File, ProtobufSchemaError> {
    if let Some(mut descriptor) = descriptor_of(text) {
        if let Some(import) = import {
            descriptor.name = Some(import.to_string());
        } else if descriptor.name.as_deref().is_none_or(str::is_empty) {
            descriptor.name = Some(name.to_string());
        }
        return Ok(File::from_file_descriptor_proto(descriptor));
    }
    File::from_source(name, text)
        .map_err(|e| ProtobufSchemaError::Invalid(format!("`{name}` is not Protobuf source: {e}")))
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

#[cfg(test)]
mod tests {
    use super::*;

    const ORDERS: &str = r#"syntax = "proto3";
        package shop;
        import "google/protobuf/timestamp.proto";
        message Order { int64 id = 1; google.protobuf.Timestamp at = 2; }"#;

    fn registered(schema: &str) -> RegisteredSchema {
        RegisteredSchema {
            id: 3,
            schema: schema.to_string(),
            schema_type: crate::SchemaType::Protobuf,
            references: Vec::new(),
            version: None,
        }
    }

    fn registry() -> SchemaRegistry {
        SchemaRegistry::new(&crate::RegistrySettings::new("http://127.0.0.1:9/")).unwrap()
    }

    #[tokio::test]
    async fn proto_text_and_base64_descriptors_compile_to_the_same_file() {
        let file = compile(&registry(), &registered(ORDERS)).await.unwrap();
        let order = file.messages().next().unwrap();
        assert_eq!(order.full_name(), "shop.Order");
        let encoded = base64::engine::general_purpose::STANDARD
            .encode(file.file_descriptor_proto().encode_to_vec());
        let again = compile(&registry(), &registered(&encoded)).await.unwrap();
        assert_eq!(again.messages().next().unwrap().fields().count(), 2);
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
