//! Which topics a source reads ([`TopicSelection`]), the partition a position belongs to ([`TopicPartition`]),
//! and which partitions are a subtask's share ([`PartitionShare`]).

use std::fmt;

use connector_api::{Error, ErrorKind, Phase, Result};
use regex::Regex;

/// The topics a source reads.
#[derive(Debug, Clone)]
pub enum TopicSelection {
    /// One topic (`[source] topic`).
    One(String),
    /// These topics (`[source] topics`); each must exist when the source opens.
    List(Vec<String>),
    /// Every topic whose whole name matches the pattern (`[source] topic_pattern`): those there when the source
    /// opens, and those created later, found by the metadata refresh and read from their beginning. Internal
    /// topics (`__consumer_offsets`, `__transaction_state`) are never selected, nor a topic the job writes itself
    /// (`written`: see [`excluding_written`](Self::excluding_written)).
    Pattern {
        /// The pattern, anchored to whole names.
        regex: Regex,
        /// Whole-name patterns of the topics the job writes (a Kafka sink's topic, its dead-letter topic).
        written: Vec<Regex>,
    },
}

impl TopicSelection {
    /// The topics matching `pattern` as a whole name (`orders-.*` selects `orders-eu`, not `old-orders-eu`).
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) naming the pattern when it is not a regular expression.
    pub fn pattern(pattern: &str) -> Result<Self> {
        Regex::new(&format!("^(?:{pattern})$"))
            .map(|regex| Self::Pattern {
                regex,
                written: Vec::new(),
            })
            .map_err(|e| {
                Error::new(
                    ErrorKind::Config,
                    Phase::Setup,
                    format!("topic_pattern {pattern:?} is not a regular expression"),
                )
                .with_source(e)
            })
    }

    /// The topics named (one or a list); `None` for a pattern.
    pub fn named(&self) -> Option<Vec<String>> {
        match self {
            Self::One(topic) => Some(vec![topic.clone()]),
            Self::List(topics) => Some(topics.clone()),
            Self::Pattern { .. } => None,
        }
    }

    /// This selection, never selecting a topic whose whole name matches one of `written` (the topics the job
    /// writes itself), so a pattern's topic created later that the job writes is not read back. Only a pattern
    /// is changed: a named topic the job writes is refused before the source opens.
    #[must_use]
    pub fn excluding_written(self, written: Vec<Regex>) -> Self {
        match self {
            Self::Pattern { regex, .. } => Self::Pattern { regex, written },
            named => named,
        }
    }

    /// Whether `topic` matches the pattern but is skipped because the job writes it (to be said once).
    pub fn skips_as_written(&self, topic: &str) -> bool {
        match self {
            Self::Pattern { regex, written } => {
                regex.is_match(topic) && written.iter().any(|w| w.is_match(topic))
            }
            _ => false,
        }
    }

    /// Whether `topic` is selected.
    pub fn selects(&self, topic: &str) -> bool {
        match self {
            Self::One(one) => one == topic,
            Self::List(topics) => topics.iter().any(|t| t == topic),
            Self::Pattern { regex, written } => {
                regex.is_match(topic) && !written.iter().any(|w| w.is_match(topic))
            }
        }
    }

    /// Whether partitions are spread over the subtasks by topic too (more than the one topic of
    /// [`One`](Self::One)): see [`PartitionShare`].
    fn spreads(&self) -> bool {
        !matches!(self, Self::One(_))
    }
}

impl fmt::Display for TopicSelection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::One(topic) => write!(f, "topic {topic}"),
            Self::List(topics) => write!(f, "topics {}", topics.join(", ")),
            Self::Pattern { regex, .. } => {
                let text = regex.as_str();
                let inner = text
                    .strip_prefix("^(?:")
                    .and_then(|t| t.strip_suffix(")$"))
                    .unwrap_or(text);
                write!(f, "topics matching {inner:?}")
            }
        }
    }
}

/// A partition of a topic: where a position belongs.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TopicPartition {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
}

impl TopicPartition {
    /// Partition `partition` of `topic`.
    pub fn new(topic: impl Into<String>, partition: i32) -> Self {
        Self {
            topic: topic.into(),
            partition,
        }
    }
}

impl fmt::Display for TopicPartition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.topic, self.partition)
    }
}

/// A fixed share of the partitions: a job of `of` subtasks gives subtask `index` this share, so every partition
/// has exactly one subtask, whichever process runs it, for as long as the subtask count stays.
///
/// With one topic, partition `p` is in share `p % of` (so a topic's partitions are dealt out in turn). With
/// several, partition `p` of topic `t` is in share `(h(t) + p) % of`, `h` being 32-bit FNV-1a of the topic's
/// name: each topic starts its turn at a subtask of its own, so many topics of few partitions do not all land on
/// the first subtasks, and a topic added later never moves another topic's partitions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionShare {
    /// The subtask, `0..of`.
    pub index: u32,
    /// The number of subtasks.
    pub of: u32,
}

impl PartitionShare {
    /// Whether partition `partition` of a job reading only one topic is in the share.
    pub fn contains(&self, partition: i32) -> bool {
        self.turn(0, partition)
    }

    /// Whether partition `partition` of `topic`, read as `selection` says, is in the share.
    pub fn holds(&self, selection: &TopicSelection, topic: &str, partition: i32) -> bool {
        let start = if selection.spreads() {
            topic_hash(topic)
        } else {
            0
        };
        self.turn(start, partition)
    }

    fn turn(&self, start: u32, partition: i32) -> bool {
        let of = u64::from(self.of.max(1));
        u64::try_from(partition).is_ok_and(|p| (u64::from(start) + p) % of == u64::from(self.index))
    }
}

/// 32-bit FNV-1a of a topic name's bytes: fixed forever (a subtask's share, and the names of a routed sink's
/// instances, must not change between releases).
pub fn topic_hash(text: &str) -> u32 {
    text.bytes().fold(0x811c_9dc5_u32, |hash, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_topic_deals_partitions_in_turn_and_many_start_at_their_own_subtask() {
        let share = |index| PartitionShare { index, of: 3 };
        let one = TopicSelection::One("orders".into());
        assert!(share(1).holds(&one, "orders", 4));
        assert!(share(1).contains(4));
        // FNV-1a is fixed: these values pin the shares of existing jobs.
        assert_eq!(topic_hash(""), 0x811c_9dc5);
        assert_eq!(topic_hash("a"), 0xe40c_292c);
        let many = TopicSelection::List(vec!["a".into(), "b".into()]);
        let start = (0xe40c_292c_u64 % 3) as u32;
        assert!(share(start).holds(&many, "a", 0));
        assert!(share((start + 1) % 3).holds(&many, "a", 1));
        // Every partition of every topic in exactly one share.
        for topic in ["a", "b", "orders-eu", "orders-us"] {
            for partition in 0..7 {
                let holders = (0..3)
                    .filter(|&i| share(i).holds(&many, topic, partition))
                    .count();
                assert_eq!(holders, 1, "{topic}/{partition}");
            }
        }
    }

    #[test]
    fn a_pattern_matches_whole_names_and_says_what_it_is() {
        let pattern = TopicSelection::pattern("orders-.*").unwrap();
        assert!(pattern.selects("orders-eu"));
        assert!(!pattern.selects("old-orders-eu"));
        assert_eq!(pattern.to_string(), "topics matching \"orders-.*\"");
        assert_eq!(pattern.named(), None);
        let written = Regex::new("^(?:orders-.*-copy)$").unwrap();
        let pattern = pattern.excluding_written(vec![written]);
        assert!(pattern.selects("orders-eu"));
        assert!(!pattern.selects("orders-eu-copy"));
        assert!(pattern.skips_as_written("orders-eu-copy"));
        assert!(!pattern.skips_as_written("old-orders-eu-copy"));
        let error = TopicSelection::pattern("orders-(").unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Config);
        assert!(error.to_string().contains("orders-("), "{error}");
    }
}
