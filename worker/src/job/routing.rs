//! Routing by topic: a `[[sinks]]` entry whose settings name `${topic}` or `${topic_safe}` in a string (a JDBC or
//! Iceberg `table`, a file `path`, a Kafka `topic`) runs as one instance per source topic, each with the
//! placeholders replaced by its topic and an id of its own ([`instance_id`]), which scopes what it owns in the
//! external system (transactional ids, prepared transactions, staged files, ledger entries) exactly as a sink of
//! its own would. A batch is always of one topic, so each batch goes to the instance of its topic and to every
//! entry that is not routed.
//!
//! Which instances a subtask builds: one per topic in which its share holds a partition when it starts, plus one
//! per topic its restored checkpoint has positions for (so a topic no longer selected still has its decided work
//! committed). A topic that appears while it runs (a pattern's new topic, or partitions that joined the share)
//! makes the subtask checkpoint what it read and start again with the new instance ([`crate::subtask`]).

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Result, bail};
use connector_api::{SinkId, SinkSpec};
use serde_json::Value;

use crate::config::routed::{TOPIC, TOPIC_SAFE, is_routed, safe_name};

/// One sink a subtask builds: an entry as it is, or a routed entry's instance for one topic.
#[derive(Debug, Clone)]
pub struct Instance {
    /// The `[[sinks]]` entry's id.
    pub entry: SinkId,
    /// The settings to build it from (for an instance: the placeholders replaced, the instance's id).
    pub spec: SinkSpec,
    /// The topic whose batches it takes (`None`: every batch).
    pub route: Option<String>,
}

/// The id of routed entry `id`'s instance for `topic`: `<id>-<topic>` when the topic's name is made only of
/// letters, digits, `-` and `_` and fits; otherwise `<id>-<the name, other characters made '_', shortened>-<8 hex
/// digits of its hash>`, so `orders.v1` and `orders_v1` get different instances. Fixed forever: it scopes the
/// instance's state in the external system.
pub fn instance_id(id: &SinkId, topic: &str) -> SinkId {
    const MAX: usize = 64;
    let plain = format!("{id}-{topic}");
    let embeddable = topic
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if embeddable && plain.len() <= MAX {
        return SinkId::new(plain).expect("letters, digits, '-' and '_', at most 64");
    }
    let hash = format!("{:08x}", kafka_source::topic_hash(topic));
    let room = MAX.saturating_sub(id.as_str().len() + 2 + hash.len());
    let name: String = topic
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(room)
        .collect();
    SinkId::new(format!("{id}-{name}-{hash}")).expect("letters, digits, '-' and '_', at most 64")
}

/// Routed entry `spec`'s instance for `topic`: the placeholders replaced in every string, the instance's id.
pub fn render(spec: &SinkSpec, topic: &str) -> SinkSpec {
    let safe = safe_name(topic);
    let mut rendered = spec.clone();
    rendered.id = instance_id(&spec.id, topic);
    for value in rendered.settings.values_mut() {
        replace(value, topic, &safe);
    }
    rendered
}

fn replace(value: &mut Value, topic: &str, safe: &str) {
    match value {
        Value::String(text) => *text = text.replace(TOPIC, topic).replace(TOPIC_SAFE, safe),
        Value::Array(items) => items.iter_mut().for_each(|v| replace(v, topic, safe)),
        Value::Object(map) => map.values_mut().for_each(|v| replace(v, topic, safe)),
        _ => {}
    }
}

/// The sinks a subtask writes to when it reads `topics`: every entry that is not routed, and each routed entry's
/// instance for each topic.
///
/// # Errors
/// Two topics that route one entry to the same settings (`a.b` and `a_b` under `${topic_safe}`), or two instances
/// with one id: named, with what to change.
pub fn instances(specs: &[SinkSpec], topics: &BTreeSet<String>) -> Result<Vec<Instance>> {
    let mut built = Vec::new();
    for spec in specs {
        if !is_routed(spec) {
            built.push(Instance {
                entry: spec.id.clone(),
                spec: spec.clone(),
                route: None,
            });
            continue;
        }
        let mut targets: BTreeMap<String, &str> = BTreeMap::new();
        for topic in topics {
            let rendered = render(spec, topic);
            let target = Value::Object(rendered.settings.clone()).to_string();
            if let Some(first) = targets.insert(target, topic) {
                bail!(
                    "topics {first} and {topic} route sink {} to the same place (its settings come out the same \
                     for both): two instances would write it under different ids. Route by {TOPIC} (the exact \
                     name) or read only one of the two",
                    spec.id
                );
            }
            built.push(Instance {
                entry: spec.id.clone(),
                spec: rendered,
                route: Some(topic.clone()),
            });
        }
    }
    let mut ids = BTreeSet::new();
    if let Some(twice) = built.iter().find(|i| !ids.insert(i.spec.id.clone())) {
        bail!(
            "two sinks of the job would have id {}: rename the [[sinks]] entry that clashes with a routed \
             sink's per-topic instance",
            twice.spec.id
        );
    }
    Ok(built)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::routed::{MAX_ROUTED_ID, check};

    fn spec(text: &str) -> SinkSpec {
        toml::from_str(text).unwrap()
    }

    fn topics(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn a_routed_entry_becomes_one_instance_per_topic_and_the_others_stay_as_they_are() {
        let routed = spec(
            "type = 'jdbc'\nid = 'pg'\nurl = 'postgres://x'\ntable = 'raw_${topic_safe}'\ncreate_table = true",
        );
        let plain = spec("type = 'file'\nid = 'lake'\npath = '/data'");
        assert!(is_routed(&routed) && !is_routed(&plain));
        let built = instances(&[routed, plain.clone()], &topics(&["orders", "orders.v2"])).unwrap();
        let summary: Vec<(String, Option<String>, String)> = built
            .iter()
            .map(|i| {
                let table = i.spec.settings.get("table").or(i.spec.settings.get("path"));
                (
                    i.spec.id.to_string(),
                    i.route.clone(),
                    table.unwrap().as_str().unwrap().to_string(),
                )
            })
            .collect();
        let hash = format!("{:08x}", kafka_source::topic_hash("orders.v2"));
        assert_eq!(
            summary,
            vec![
                (
                    "pg-orders".into(),
                    Some("orders".into()),
                    "raw_orders".into()
                ),
                (
                    format!("pg-orders_v2-{hash}"),
                    Some("orders.v2".into()),
                    "raw_orders_v2".into()
                ),
                ("lake".into(), None, "/data".into()),
            ]
        );
        assert_eq!(built[2].spec.settings, plain.settings);
    }

    #[test]
    fn instance_ids_are_fixed_distinct_and_short_enough() {
        let id = SinkId::new("x".repeat(MAX_ROUTED_ID)).unwrap();
        let long = "t".repeat(249);
        for topic in ["a", "a.b", "a_b", long.as_str(), "é"] {
            assert!(instance_id(&id, topic).as_str().len() <= 64, "{topic}");
        }
        assert_ne!(instance_id(&id, "a.b"), instance_id(&id, "a_b"));
        let sink = SinkId::new("s").unwrap();
        assert_eq!(instance_id(&sink, "orders-eu_1").as_str(), "s-orders-eu_1");
        // Pinned: an instance's id names its state in the external systems.
        assert_eq!(instance_id(&sink, "a.b").as_str(), "s-a_b-108bf50c");
    }

    #[test]
    fn topics_that_route_to_one_place_and_ids_that_clash_are_refused() {
        let routed = spec("type = 'jdbc'\nid = 'pg'\ntable = '${topic_safe}'");
        let err = instances(std::slice::from_ref(&routed), &topics(&["a.b", "a_b"]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("topics a.b and a_b route sink pg to the same place"),
            "{err}"
        );

        let clash = spec("type = 'file'\nid = 'pg-x'\npath = '/d'");
        let err = check(&[routed.clone(), clash]).unwrap_err().to_string();
        assert!(
            err.contains("sink pg-x begins with routed sink pg's id"),
            "{err}"
        );

        let typo = spec("type = 'jdbc'\nid = 'pg'\ntable = 'raw_${topics}'");
        let err = check(&[typo]).unwrap_err().to_string();
        assert!(err.contains("\"${topics}\" is not a placeholder"), "{err}");

        let shared = spec(
            "type = 'kafka'\nid = 'out'\ntopic = 'copy.${topic}'\ntransactional_id_prefix = 'out'",
        );
        let err = check(&[shared]).unwrap_err().to_string();
        assert!(
            err.contains("`transactional_id_prefix` names no ${topic}"),
            "{err}"
        );
        check(&[spec(
            "type = 'jdbc'\nid = 'pg'\ntable = 't_${topic_safe}'\nscope = 's_${topic_safe}'",
        )])
        .unwrap();

        let long = spec(&format!(
            "type = 'jdbc'\nid = '{}'\ntable = '${{topic}}'",
            "p".repeat(41)
        ));
        assert!(
            check(&[long])
                .unwrap_err()
                .to_string()
                .contains("shorter id")
        );
        check(&[routed]).unwrap();
    }
}
