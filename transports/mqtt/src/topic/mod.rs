//! Topic names, topic filters, and the two trees the broker keeps them in (MQTT 3.1.1 section 4.7).
//!
//! A topic name has no wildcards; a filter may use `+` for exactly one level and `#` for any number of trailing
//! levels (including none: `a/#` matches `a`). Filters that begin with a wildcard do not match names that begin with
//! `$` [MQTT-4.7.2-1], so `#` does not see `$SYS/...`.
//!
//! The broker refuses names and filters of more than [`MAX_LEVELS`] levels (a filter gets SUBACK 0x80, a PUBLISH
//! closes its connection): the specification sets no limit but the 65,535-byte string, and a tree 65,000 levels deep
//! costs memory and time for nothing. Every walk of the trees ([`trie`]) is iterative all the same, so no input can
//! exhaust the stack.

pub mod trie;

pub use trie::{RetainedTree, SubscriptionTree};

/// The most levels a topic name or filter may have on this broker (mosquitto's limit is 200).
pub const MAX_LEVELS: usize = 128;

/// Levels in a name or filter: one more than its separators.
pub fn levels(topic: &str) -> usize {
    topic.bytes().filter(|&b| b == b'/').count() + 1
}

/// Whether a name or filter is within [`MAX_LEVELS`].
pub fn within_level_cap(topic: &str) -> bool {
    // Counting stops at the cap, so a 65,535-byte topic costs no more than a short one.
    topic
        .bytes()
        .filter(|&b| b == b'/')
        .take(MAX_LEVELS)
        .count()
        < MAX_LEVELS
}

/// A topic name as PUBLISH carries it: at least one character, no `+` or `#` [MQTT-4.7.3-1, MQTT-3.3.2-2].
pub fn valid_name(name: &str) -> bool {
    !name.is_empty() && !name.contains(['+', '#'])
}

/// A topic filter as SUBSCRIBE carries it: at least one character; `#` only as the last level and alone in it;
/// `+` alone in its level [MQTT-4.7.1-2, MQTT-4.7.1-3].
pub fn valid_filter(filter: &str) -> bool {
    if filter.is_empty() {
        return false;
    }
    let mut levels = filter.split('/').peekable();
    while let Some(level) = levels.next() {
        let last = levels.peek().is_none();
        if level.contains('#') && (level != "#" || !last) {
            return false;
        }
        if level.contains('+') && level != "+" {
            return false;
        }
    }
    true
}

/// Whether `filter` matches `name` (both assumed valid).
pub fn matches(filter: &str, name: &str) -> bool {
    if name.starts_with('$') && filter.starts_with(['+', '#']) {
        return false;
    }
    let mut f = filter.split('/');
    let mut n = name.split('/');
    loop {
        match (f.next(), n.next()) {
            (Some("#"), _) => return true,
            (Some("+"), Some(_)) => {}
            (Some(a), Some(b)) if a == b => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_filters() {
        assert!(valid_name("a/b") && valid_name("/") && valid_name("$SYS/x"));
        assert!(!valid_name("") && !valid_name("a/+") && !valid_name("a/#"));
        for f in ["#", "+", "a/#", "a/+/b", "+/+", "/#", "a//b", "+/#"] {
            assert!(valid_filter(f), "{f}");
        }
        for f in ["", "a#", "a/#/b", "a+/b", "a/b+", "##", "#/"] {
            assert!(!valid_filter(f), "{f}");
        }
    }

    #[test]
    fn matching_follows_the_specification_examples() {
        // Section 4.7.1.2 and 4.7.1.3.
        assert!(matches("sport/tennis/player1/#", "sport/tennis/player1"));
        assert!(matches(
            "sport/tennis/player1/#",
            "sport/tennis/player1/ranking"
        ));
        assert!(matches(
            "sport/tennis/player1/#",
            "sport/tennis/player1/score/wimbledon"
        ));
        assert!(matches("sport/#", "sport"));
        assert!(matches("sport/tennis/+", "sport/tennis/player1"));
        assert!(!matches("sport/tennis/+", "sport/tennis/player1/ranking"));
        assert!(!matches("sport/+", "sport"));
        assert!(matches("sport/+", "sport/"));
        assert!(matches("+/+", "/finance"));
        assert!(matches("/+", "/finance"));
        assert!(!matches("+", "/finance"));
        // Section 4.7.2.
        assert!(!matches("#", "$SYS/broker/load"));
        assert!(!matches("+/monitor/Clients", "$SYS/monitor/Clients"));
        assert!(matches("$SYS/#", "$SYS/monitor/Clients"));
        assert!(matches("$SYS/monitor/+", "$SYS/monitor/Clients"));
    }
}
