//! A job never reads what it writes. A Kafka sink on the source's cluster, or the dead-letter topic, writes topics
//! the selection could pick up again: each record would come back, be written again, and so on for ever (a
//! refused row dead-lettered, read back from the dead-letter topic, refused again...). So:
//!
//! - a named topic (`topic`, `topics`) the job writes is refused when the job file is loaded;
//! - a `topic_pattern` that matches a topic the job writes is refused by `check-config` and at start
//!   ([`refuse_reading_written`]): a fixed name the pattern matches, or a routed sink's topic (`${topic}...`)
//!   rendered for a topic the pattern selects now;
//! - a topic created later that the pattern matches and the job writes is skipped with a warning naming it (the
//!   selection excludes every written topic, [`JobConfig::selection`]).
//!
//! A Kafka sink writes the source's cluster when its `bootstrap_servers` name the same brokers (compared as a set
//! of `host:port`); a sink on another cluster may write topics of the source's names (mirroring).

use std::collections::BTreeSet;

use anyhow::{Result, bail};
use connector_api::SinkBuilder;
use kafka_sink::KafkaSinkFactory;
use kafka_source::TopicSelection;
use regex::Regex;

use super::JobConfig;
use super::routed::{TOPIC, TOPIC_SAFE};

/// A topic the job writes on the source's cluster.
#[derive(Debug, Clone)]
pub struct WrittenTopic {
    /// Who writes it: `sink <id>` or `[dead_letter]`.
    pub by: String,
    /// Its name, with `${topic}` / `${topic_safe}` when a routed sink writes one per source topic.
    pub template: String,
}

impl WrittenTopic {
    /// Its whole name as a pattern: the placeholders match any topic name (any safe name).
    fn regex(&self) -> Regex {
        let escaped = regex::escape(&self.template)
            .replace(&regex::escape(TOPIC_SAFE), "[A-Za-z0-9_]+")
            .replace(&regex::escape(TOPIC), ".+");
        Regex::new(&format!("^(?:{escaped})$")).expect("an escaped name with simple classes")
    }

    /// Its name when the source reads `topic`.
    fn rendered(&self, topic: &str) -> String {
        self.template
            .replace(TOPIC, topic)
            .replace(TOPIC_SAFE, &crate::config::routed::safe_name(topic))
    }
}

/// The brokers of a `bootstrap_servers` list, as a set.
fn brokers(list: &str) -> BTreeSet<String> {
    list.split(',')
        .map(|b| b.trim().to_ascii_lowercase())
        .filter(|b| !b.is_empty())
        .collect()
}

impl JobConfig {
    /// The topics this job writes on its source's cluster.
    pub fn written_topics(&self) -> Vec<WrittenTopic> {
        let source = brokers(&self.source.bootstrap_servers);
        let mut written: Vec<WrittenTopic> = self
            .sinks
            .iter()
            .filter(|spec| spec.kind == KafkaSinkFactory::KIND)
            .filter(|spec| {
                spec.settings
                    .get("bootstrap_servers")
                    .and_then(|b| b.as_str())
                    .is_none_or(|b| brokers(b) == source)
            })
            .filter_map(|spec| {
                let topic = spec.settings.get("topic")?.as_str()?;
                Some(WrittenTopic {
                    by: format!("sink {}", spec.id),
                    template: topic.to_string(),
                })
            })
            .collect();
        if let Some(dead_letter) = &self.dead_letter {
            written.push(WrittenTopic {
                by: "[dead_letter]".into(),
                template: dead_letter.topic.clone(),
            });
        }
        written
    }

    /// What the source reads: [`KafkaSourceSettings::selection`](kafka_source::KafkaSourceSettings::selection), never a topic the job
    /// writes (module docs).
    ///
    /// # Errors
    /// As `KafkaSourceSettings::selection`, and a named topic the job writes (naming it and the writer).
    pub fn selection(&self) -> Result<TopicSelection> {
        let selection = self.source.selection()?;
        let written = self.written_topics();
        for topic in selection.named().into_iter().flatten() {
            if let Some(writer) = written.iter().find(|w| w.regex().is_match(&topic)) {
                bail!(
                    "[source] reads topic {topic:?}, which this job writes ({} writes {:?}): a job never reads \
                     what it writes (every record would come back again and again); read another topic, or \
                     write another",
                    writer.by,
                    writer.template
                );
            }
        }
        Ok(selection.excluding_written(written.iter().map(WrittenTopic::regex).collect()))
    }
}

/// Refuses a `topic_pattern` that matches a topic the job writes: a fixed name, or a routed sink's topic for a
/// topic the pattern selects now (`selected_now`). Named selections are refused by [`JobConfig::selection`].
///
/// # Errors
/// Naming the pattern, the topic and who writes it.
pub fn refuse_reading_written(job: &JobConfig, selected_now: &BTreeSet<String>) -> Result<()> {
    let selection = job.source.selection()?;
    let TopicSelection::Pattern { regex, .. } = &selection else {
        return Ok(());
    };
    for writer in job.written_topics() {
        let routed = writer.template.contains(TOPIC) || writer.template.contains(TOPIC_SAFE);
        let names: Vec<String> = if routed {
            selected_now.iter().map(|t| writer.rendered(t)).collect()
        } else {
            vec![writer.template.clone()]
        };
        if let Some(topic) = names.iter().find(|name| regex.is_match(name)) {
            bail!(
                "[source] {selection} matches {topic:?}, which this job writes ({} writes {:?}): a job never reads \
                 what it writes (every record would come back again and again); narrow the pattern, or write \
                 another topic",
                writer.by,
                writer.template
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(source: &str, sinks: &str) -> JobConfig {
        parsed(source, sinks).unwrap()
    }

    fn parsed(source: &str, sinks: &str) -> Result<JobConfig> {
        let text = format!(
            "[job]\nname = \"loop\"\n[source]\nbootstrap_servers = \"127.0.0.1:9092\"\n{source}\n\
             decoding = {{ kind = \"json\", fields = [ {{ name = \"id\", type = \"int64\" }} ] }}\n{sinks}"
        );
        JobConfig::parse(&text, [])
    }

    const COPY: &str = "[[sinks]]\ntype = \"kafka\"\nid = \"copy\"\nbootstrap_servers = \"127.0.0.1:9092\"\n\
                        topic = \"${topic}-copy\"\ntransactional_id_prefix = \"x-${topic_safe}\"\n\
                        [dead_letter]\ntopic = \"loop-dlq\"";

    #[test]
    fn a_named_topic_the_job_writes_is_refused() {
        // Refused when the job file is loaded.
        let refused = parsed("topics = [\"a\", \"a-copy\"]", COPY).unwrap_err();
        assert!(
            format!("{refused:#}").contains("\"a-copy\", which this job writes (sink copy writes"),
            "{refused:#}"
        );
        let refused = parsed("topic = \"loop-dlq\"", COPY).unwrap_err();
        assert!(
            format!("{refused:#}").contains("[dead_letter]"),
            "{refused:#}"
        );
        assert!(job("topic = \"a\"", COPY).selection().is_ok());
    }

    #[test]
    fn a_pattern_is_refused_when_it_matches_what_the_job_writes_and_skips_it_later() {
        let looping = job("topic_pattern = \"a.*\"", COPY);
        let now: BTreeSet<String> = ["a1".to_string()].into();
        let refused = refuse_reading_written(&looping, &now).unwrap_err();
        assert!(
            format!("{refused:#}").contains("\"a1-copy\""),
            "{refused:#}"
        );
        let dead_letters = job("topic_pattern = \"loop-.*\"", COPY);
        assert!(refuse_reading_written(&dead_letters, &BTreeSet::new()).is_err());
        // Nothing selected now: nothing to refuse; a topic created later that this job writes is skipped.
        let later = job("topic_pattern = \"a.*\"", COPY);
        refuse_reading_written(&later, &BTreeSet::new()).unwrap();
        let selection = later.selection().unwrap();
        assert!(selection.selects("a1"));
        assert!(!selection.selects("a1-copy") && selection.skips_as_written("a1-copy"));
    }

    #[test]
    fn a_sink_on_another_cluster_may_write_the_names_the_source_reads() {
        let mirror = job(
            "topic = \"a\"",
            "[[sinks]]\ntype = \"kafka\"\nid = \"mirror\"\nbootstrap_servers = \"10.0.0.9:9092\"\ntopic = \"a\"\n\
             transactional_id_prefix = \"m\"",
        );
        assert!(mirror.selection().is_ok());
    }
}
