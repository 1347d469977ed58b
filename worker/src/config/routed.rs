//! The job file's rules for sink entries routed by topic (`${topic}`, `${topic_safe}` in a setting's string):
//! what makes an entry routed, and the checks made when the file is loaded. What a routed entry becomes at run
//! time (one instance per topic) is [`crate::job::routing`].

use anyhow::{Result, bail};
use connector_api::SinkSpec;
use serde_json::Value;

/// Replaced by the topic's name as it is.
pub const TOPIC: &str = "${topic}";

/// Replaced by the topic's name with every character other than an ASCII letter, digit or `_` made `_`: for table
/// names, where `.` would name a schema or namespace and `-` needs quoting.
pub const TOPIC_SAFE: &str = "${topic_safe}";

/// The longest id a routed entry may have: its instances' ids add `-` and the topic (or a hash of it).
pub const MAX_ROUTED_ID: usize = 40;

/// Settings that name what a sink owns in its external system instead of its id (JDBC and file `scope`, Kafka
/// `transactional_id_prefix`): in a routed entry each must differ per topic.
const IDENTITY_KEYS: [&str; 2] = ["scope", "transactional_id_prefix"];

/// Whether `spec` is routed by topic: one of its settings' strings names a placeholder.
pub fn is_routed(spec: &SinkSpec) -> bool {
    spec.settings.values().any(names_placeholder)
}

fn names_placeholder(value: &Value) -> bool {
    match value {
        Value::String(text) => text.contains(TOPIC) || text.contains(TOPIC_SAFE),
        Value::Array(items) => items.iter().any(names_placeholder),
        Value::Object(map) => map.values().any(names_placeholder),
        _ => false,
    }
}

/// Checks the job's entries for routing: a routed entry's id leaves room for its instances' ids, no other entry's
/// id could be one of them, and no string names an unknown `${topic...}` placeholder.
///
/// # Errors
/// Naming the entry and what to change.
pub fn check(specs: &[SinkSpec]) -> Result<()> {
    for spec in specs {
        if let Some(unknown) = unknown_placeholder(&Value::Object(spec.settings.clone())) {
            bail!(
                "sink {}: {unknown:?} is not a placeholder Ratchet knows; use {TOPIC} (the topic's name) or \
                 {TOPIC_SAFE} (the name with every character other than a letter, digit or '_' made '_')",
                spec.id
            );
        }
        if !is_routed(spec) {
            continue;
        }
        if spec.id.as_str().len() > MAX_ROUTED_ID {
            bail!(
                "sink {} is routed by topic, and its id is longer than {MAX_ROUTED_ID} characters: each topic's \
                 instance is named `<id>-<topic>`, at most 64 characters. Give it a shorter id",
                spec.id
            );
        }
        if let Some(key) = IDENTITY_KEYS.iter().find(|key| {
            spec.settings
                .get(**key)
                .is_some_and(|value| !names_placeholder(value))
        }) {
            bail!(
                "sink {} is routed by topic, and its `{key}` names no {TOPIC} or {TOPIC_SAFE}: every topic's \
                 instance would use the same transactions and state and fence the others. Add a placeholder to \
                 it, or remove it (each instance is then scoped by its own id)",
                spec.id
            );
        }
        let prefix = format!("{}-", spec.id);
        if let Some(other) = specs
            .iter()
            .find(|other| other.id != spec.id && other.id.as_str().starts_with(&prefix))
        {
            bail!(
                "sink {} begins with routed sink {}'s id and a '-', the names of that sink's per-topic instances: \
                 a topic could give one of them this id. Rename one of the two",
                other.id,
                spec.id
            );
        }
    }
    Ok(())
}

/// The first `${topic...}` in `value`'s strings that is neither placeholder.
fn unknown_placeholder(value: &Value) -> Option<String> {
    match value {
        Value::String(text) => text.match_indices("${").find_map(|(at, _)| {
            let rest = &text[at..];
            let end = rest.find('}').map_or(rest.len(), |end| end + 1);
            let named = &rest[..end];
            (named.starts_with("${topic") && named != TOPIC && named != TOPIC_SAFE)
                .then(|| named.to_string())
        }),
        Value::Array(items) => items.iter().find_map(unknown_placeholder),
        Value::Object(map) => map.values().find_map(unknown_placeholder),
        _ => None,
    }
}

/// `topic` with every character other than an ASCII letter, digit or `_` made `_` ([`TOPIC_SAFE`]).
pub fn safe_name(topic: &str) -> String {
    topic
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}
