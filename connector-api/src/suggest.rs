//! "Did you mean": the nearest valid key for a misspelt one, added to serde's unknown-field errors.

/// `message` with the nearest valid key appended when it is serde's "unknown field `x`, expected one of `a`, `b`"
/// (or "expected `a`") and one of the expected keys is close to `x` (Jaro-Winkler similarity of at least 0.8, the
/// threshold clap uses); otherwise `message` unchanged.
///
/// ```
/// let e = "unknown field `topik`, expected one of `topic`, `client`";
/// assert!(connector_api::with_suggestion(e).ends_with("(did you mean `topic`?)"));
/// ```
pub fn with_suggestion(message: &str) -> String {
    match nearest_expected(message) {
        Some(key) => format!("{} (did you mean `{key}`?)", message.trim_end()),
        None => message.to_string(),
    }
}

fn nearest_expected(message: &str) -> Option<&str> {
    let rest = message.split("unknown field `").nth(1)?;
    let (unknown, expected) = rest.split_once('`')?;
    let expected = expected.split("expected").nth(1)?;
    expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(|key| (strsim::jaro_winkler(unknown, key), key))
        .filter(|(score, _)| *score >= 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, key)| key)
}

#[cfg(test)]
mod tests {
    use super::with_suggestion;

    #[test]
    fn suggests_the_nearest_key_and_only_a_near_one() {
        let one_of = "unknown field `chekpoint_interval`, expected one of `name`, `subtasks`, \
                      `checkpoint_interval` at line 3 column 1";
        assert!(with_suggestion(one_of).ends_with("(did you mean `checkpoint_interval`?)"));
        let single = "unknown field `topics`, expected `topic`";
        assert!(with_suggestion(single).ends_with("(did you mean `topic`?)"));
        let far = "unknown field `zzz`, expected one of `name`, `subtasks`";
        assert_eq!(with_suggestion(far), far);
        assert_eq!(with_suggestion("missing field `id`"), "missing field `id`");
    }
}
