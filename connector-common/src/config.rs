//! Configuration helpers: "did you mean" for misspelt keys, and the one rule for showing a URL in a message.

/// `message` with the nearest valid key appended when it is serde's "unknown field `x`, expected one of `a`, `b`"
/// (or "expected `a`") and one of the expected keys is close to `x` (Jaro-Winkler similarity of at least 0.8, the
/// threshold clap uses); otherwise `message` unchanged.
///
/// ```
/// let e = "unknown field `topik`, expected one of `topic`, `client`";
/// assert!(connector_common::config::with_suggestion(e).ends_with("(did you mean `topic`?)"));
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

/// What replaces a password in a URL.
const MASK: &str = "***";

/// `url` as it may appear in a message or a log: the password of its user info and the value of any query
/// parameter that can carry a secret (`password`, `sslpassword`, `token`, `secret`, `credential`…) replaced by
/// `***`. Text that is not a URL (a key-value DSN such as `host=h password=p` may hold a password anywhere) is
/// never shown.
///
/// ```
/// use connector_common::config::redact_url;
/// assert_eq!(redact_url("postgres://u:hunter2@h/db"), "postgres://u:***@h/db");
/// assert_eq!(redact_url("postgres://u@h/db?password=hunter2"), "postgres://u@h/db?password=***");
/// assert_eq!(redact_url("host=h password=hunter2"), "<not shown: not a URL>");
/// ```
pub fn redact_url(url: &str) -> String {
    let Ok(mut parsed) = url::Url::parse(url) else {
        return "<not shown: not a URL>".to_string();
    };
    if parsed.password().is_some() {
        let _ = parsed.set_password(Some(MASK));
    }
    if parsed
        .query_pairs()
        .any(|(key, _)| is_secret_parameter(&key))
    {
        let pairs: Vec<(String, String)> = parsed
            .query_pairs()
            .map(|(key, value)| {
                let value = if is_secret_parameter(&key) {
                    MASK.to_string()
                } else {
                    value.into_owned()
                };
                (key.into_owned(), value)
            })
            .collect();
        parsed.query_pairs_mut().clear().extend_pairs(pairs);
    }
    parsed.to_string()
}

fn is_secret_parameter(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    ["password", "secret", "token", "credential", "key"]
        .iter()
        .any(|word| key.contains(word))
        && key != "sslkey"
}

#[cfg(test)]
mod tests {
    use super::{redact_url, with_suggestion};

    #[test]
    fn urls_never_show_a_password() {
        for (url, shown) in [
            (
                "postgres://u:hunter2@127.0.0.1/db",
                "postgres://u:***@127.0.0.1/db",
            ),
            (
                "mysql://ratchet:s3cret@127.0.0.1:3306/db",
                "mysql://ratchet:***@127.0.0.1:3306/db",
            ),
            (
                "postgres://u@h/db?sslmode=require&password=hunter2",
                "postgres://u@h/db?sslmode=require&password=***",
            ),
            (
                "https://catalog.example/api?token=hunter2&x=1",
                "https://catalog.example/api?token=***&x=1",
            ),
            (
                "postgres://u@h/db?sslkey=/k.pem",
                "postgres://u@h/db?sslkey=/k.pem",
            ),
            ("http://127.0.0.1:8181", "http://127.0.0.1:8181/"),
            ("host=127.0.0.1 password=hunter2", "<not shown: not a URL>"),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
        }
    }

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
