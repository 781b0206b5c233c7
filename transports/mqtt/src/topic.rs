//! Topic names, topic filters and the subscription tree (MQTT 3.1.1 section 4.7).
//!
//! A topic name has no wildcards; a filter may use `+` for exactly one level and `#` for any number of trailing
//! levels (including none: `a/#` matches `a`). Filters that begin with a wildcard do not match names that begin with
//! `$` [MQTT-4.7.2-1], so `#` does not see `$SYS/...`.

use crate::codec::QoS;
use std::collections::HashMap;

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

/// Subscriptions indexed by level, so a publish visits only the branches its name can match.
#[derive(Debug)]
pub struct SubscriptionTree<K> {
    root: Node<K>,
    len: usize,
}

#[derive(Debug)]
struct Node<K> {
    /// Literal levels and `+`, which no topic name can contain, so it cannot collide with a literal.
    children: HashMap<Box<str>, Node<K>>,
    /// Subscribers of `<this node's prefix>/#`.
    multi: Vec<(K, QoS)>,
    /// Subscribers whose filter ends at this node.
    exact: Vec<(K, QoS)>,
}

impl<K> Default for Node<K> {
    fn default() -> Self {
        Node {
            children: HashMap::new(),
            multi: Vec::new(),
            exact: Vec::new(),
        }
    }
}

impl<K> Node<K> {
    fn is_empty(&self) -> bool {
        self.children.is_empty() && self.multi.is_empty() && self.exact.is_empty()
    }
}

impl<K> Default for SubscriptionTree<K> {
    fn default() -> Self {
        SubscriptionTree {
            root: Node::default(),
            len: 0,
        }
    }
}

impl<K: Copy + Eq + Ord> SubscriptionTree<K> {
    /// An empty tree.
    pub fn new() -> Self {
        Self::default()
    }

    /// Subscriptions held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// No subscriptions.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Subscribe `key` to a valid `filter`, replacing the QoS of an identical subscription [MQTT-3.8.4-3].
    pub fn insert(&mut self, filter: &str, key: K, qos: QoS) {
        let mut node = &mut self.root;
        let mut levels = filter.split('/').peekable();
        while let Some(level) = levels.next() {
            if level == "#" && levels.peek().is_none() {
                return Self::put(&mut node.multi, key, qos, &mut self.len);
            }
            node = node.children.entry(level.into()).or_default();
        }
        Self::put(&mut node.exact, key, qos, &mut self.len);
    }

    fn put(list: &mut Vec<(K, QoS)>, key: K, qos: QoS, len: &mut usize) {
        match list.iter_mut().find(|(k, _)| *k == key) {
            Some(entry) => entry.1 = qos,
            None => {
                list.push((key, qos));
                *len += 1;
            }
        }
    }

    /// Remove `key`'s subscription to `filter`; whether there was one.
    pub fn remove(&mut self, filter: &str, key: K) -> bool {
        let levels: Vec<&str> = filter.split('/').collect();
        let removed = Self::remove_in(&mut self.root, &levels, key);
        if removed {
            self.len -= 1;
        }
        removed
    }

    fn remove_in(node: &mut Node<K>, levels: &[&str], key: K) -> bool {
        let take = |list: &mut Vec<(K, QoS)>| match list.iter().position(|(k, _)| *k == key) {
            Some(i) => {
                list.swap_remove(i);
                true
            }
            None => false,
        };
        match levels {
            [] => take(&mut node.exact),
            ["#"] => take(&mut node.multi),
            [level, rest @ ..] => {
                let Some(child) = node.children.get_mut(*level) else {
                    return false;
                };
                let removed = Self::remove_in(child, rest, key);
                if child.is_empty() {
                    node.children.remove(*level);
                }
                removed
            }
        }
    }

    /// Every subscriber whose filter matches `name`, once each, with the highest QoS among its matching
    /// subscriptions (section 3.3.5 allows one delivery per client). `out` is cleared first.
    pub fn matching(&self, name: &str, out: &mut Vec<(K, QoS)>) {
        out.clear();
        let levels: Vec<&str> = name.split('/').collect();
        let dollar = name.starts_with('$');
        Self::walk(&self.root, &levels, 0, dollar, out);
        if out.len() > 1 {
            out.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
            out.dedup_by_key(|(k, _)| *k);
        }
    }

    fn walk(node: &Node<K>, levels: &[&str], depth: usize, dollar: bool, out: &mut Vec<(K, QoS)>) {
        let wildcard_allowed = !(depth == 0 && dollar);
        if wildcard_allowed {
            out.extend_from_slice(&node.multi);
        }
        let Some((level, rest)) = levels.split_first() else {
            out.extend_from_slice(&node.exact);
            return;
        };
        if let Some(child) = node.children.get(*level) {
            Self::walk(child, rest, depth + 1, dollar, out);
        }
        if wildcard_allowed {
            if let Some(child) = node.children.get("+") {
                Self::walk(child, rest, depth + 1, dollar, out);
            }
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

    #[test]
    fn tree_agrees_with_matches() {
        let filters = [
            "#", "+", "a", "a/#", "a/+", "a/b", "+/b", "+/+", "a/+/c", "/+", "+/#", "$SYS/#",
            "a//b", "a/b/#",
        ];
        let names = [
            "a", "a/b", "a/c", "b/b", "/x", "a/b/c", "$SYS/x", "a//b", "/", "x",
        ];
        let mut tree = SubscriptionTree::new();
        for (i, f) in filters.iter().enumerate() {
            tree.insert(f, i, QoS::AtMostOnce);
        }
        assert_eq!(tree.len(), filters.len());
        let mut out = Vec::new();
        for name in names {
            tree.matching(name, &mut out);
            let mut got: Vec<usize> = out.iter().map(|(k, _)| *k).collect();
            got.sort();
            let want: Vec<usize> = (0..filters.len())
                .filter(|&i| matches(filters[i], name))
                .collect();
            assert_eq!(got, want, "{name}");
        }
        for (i, f) in filters.iter().enumerate() {
            assert!(tree.remove(f, i));
            assert!(!tree.remove(f, i));
        }
        assert!(tree.is_empty() && tree.root.is_empty());
    }

    #[test]
    fn overlapping_subscriptions_give_one_delivery_at_the_highest_qos() {
        let mut tree = SubscriptionTree::new();
        tree.insert("a/#", 7u32, QoS::AtMostOnce);
        tree.insert("a/+", 7, QoS::AtLeastOnce);
        tree.insert("a/b", 8, QoS::AtMostOnce);
        tree.insert("a/b", 8, QoS::AtLeastOnce); // replaces
        let mut out = Vec::new();
        tree.matching("a/b", &mut out);
        assert_eq!(out, vec![(7, QoS::AtLeastOnce), (8, QoS::AtLeastOnce)]);
        assert_eq!(tree.len(), 3);
    }
}
