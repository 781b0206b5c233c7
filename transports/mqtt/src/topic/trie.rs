//! Trees indexed by topic level: the subscriptions (filters, searched with a topic name) and the retained messages
//! (names, searched with a filter). Each costs the levels a lookup can match, not the size of the tree.
//!
//! Every walk is a loop with its own stack, and a removed branch is taken apart the same way, so a tree as deep as a
//! 65,535-byte string allows (65,535 levels) costs heap, never the thread's stack. (The broker caps levels at
//! [`MAX_LEVELS`](super::MAX_LEVELS) before anything reaches a tree; the trees do not rely on it.)

use crate::codec::QoS;
use std::collections::HashMap;
use std::ops::ControlFlow;

#[derive(Debug)]
struct Node<V> {
    /// Literal levels, and `+` in the subscription tree (no topic name can contain it, so it cannot collide).
    children: HashMap<Box<str>, Node<V>>,
    value: V,
}

impl<V: Default> Default for Node<V> {
    fn default() -> Self {
        Node {
            children: HashMap::new(),
            value: V::default(),
        }
    }
}

/// Take a subtree apart level by level instead of letting `Drop` recurse through it.
fn dispose<V>(node: Node<V>) {
    let mut stack = vec![node];
    while let Some(mut n) = stack.pop() {
        stack.extend(std::mem::take(&mut n.children).into_values());
    }
}

/// A tree of levels with a value per node.
#[derive(Debug)]
struct LevelTrie<V> {
    root: Node<V>,
}

impl<V> Drop for LevelTrie<V> {
    fn drop(&mut self) {
        for child in std::mem::take(&mut self.root.children).into_values() {
            dispose(child);
        }
    }
}

impl<V: Default> LevelTrie<V> {
    fn new() -> Self {
        LevelTrie {
            root: Node::default(),
        }
    }

    /// The value at `path`, creating the nodes on the way.
    fn entry<'a>(&mut self, path: impl Iterator<Item = &'a str>) -> &mut V {
        let mut node = &mut self.root;
        for level in path {
            node = node.children.entry(level.into()).or_default();
        }
        &mut node.value
    }

    fn get_mut<'a>(&mut self, path: impl Iterator<Item = &'a str>) -> Option<&mut V> {
        let mut node = &mut self.root;
        for level in path {
            node = node.children.get_mut(level)?;
        }
        Some(&mut node.value)
    }

    fn get<'a>(&self, path: impl Iterator<Item = &'a str>) -> Option<&V> {
        let mut node = &self.root;
        for level in path {
            node = node.children.get(level)?;
        }
        Some(&node.value)
    }

    /// Remove the nodes at the end of `path` that hold nothing (`empty` value, no other children).
    fn prune(&mut self, path: &[&str], empty: impl Fn(&V) -> bool) {
        // The shallowest node from which the rest of the path holds nothing but the path itself.
        let mut cut = None;
        let mut node = &self.root;
        for (depth, level) in path.iter().enumerate() {
            let Some(child) = node.children.get(*level) else {
                return;
            };
            let last = depth + 1 == path.len();
            if empty(&child.value) && child.children.len() == usize::from(!last) {
                cut.get_or_insert(depth);
            } else {
                cut = None;
            }
            node = child;
        }
        let Some(cut) = cut else { return };
        let mut node = &mut self.root;
        for level in &path[..cut] {
            match node.children.get_mut(*level) {
                Some(child) => node = child,
                None => return,
            }
        }
        if let Some(branch) = node.children.remove(path[cut]) {
            dispose(branch);
        }
    }
}

/// The subscribers of one node: `<prefix>/#` and filters ending here.
#[derive(Debug)]
struct Subscribers<K> {
    multi: Vec<(K, QoS)>,
    exact: Vec<(K, QoS)>,
}

impl<K> Default for Subscribers<K> {
    fn default() -> Self {
        Subscribers {
            multi: Vec::new(),
            exact: Vec::new(),
        }
    }
}

/// Subscriptions indexed by level, so a publish visits only the branches its name can match.
#[derive(Debug)]
pub struct SubscriptionTree<K> {
    trie: LevelTrie<Subscribers<K>>,
    len: usize,
}

impl<K> Default for SubscriptionTree<K> {
    fn default() -> Self {
        SubscriptionTree {
            trie: LevelTrie::new(),
            len: 0,
        }
    }
}

/// A filter's path in the tree and whether it ends in `#` (stored on the node before it).
fn filter_path(filter: &str) -> (Vec<&str>, bool) {
    let mut path: Vec<&str> = filter.split('/').collect();
    let multi = path.last() == Some(&"#");
    if multi {
        path.pop();
    }
    (path, multi)
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
        let (path, multi) = filter_path(filter);
        let subs = self.trie.entry(path.into_iter());
        let list = if multi {
            &mut subs.multi
        } else {
            &mut subs.exact
        };
        match list.iter_mut().find(|(k, _)| *k == key) {
            Some(entry) => entry.1 = qos,
            None => {
                list.push((key, qos));
                self.len += 1;
            }
        }
    }

    /// Remove `key`'s subscription to `filter`; whether there was one.
    pub fn remove(&mut self, filter: &str, key: K) -> bool {
        let (path, multi) = filter_path(filter);
        let Some(subs) = self.trie.get_mut(path.iter().copied()) else {
            return false;
        };
        let list = if multi {
            &mut subs.multi
        } else {
            &mut subs.exact
        };
        let Some(i) = list.iter().position(|(k, _)| *k == key) else {
            return false;
        };
        list.swap_remove(i);
        self.len -= 1;
        self.trie
            .prune(&path, |s| s.multi.is_empty() && s.exact.is_empty());
        true
    }

    /// Every subscriber whose filter matches `name`, once each, with the highest QoS among its matching
    /// subscriptions [MQTT-3.3.5-1]. `out` is cleared first.
    pub fn matching(&self, name: &str, out: &mut Vec<(K, QoS)>) {
        out.clear();
        let levels: Vec<&str> = name.split('/').collect();
        let dollar = name.starts_with('$');
        let mut stack = vec![(&self.trie.root, 0usize)];
        while let Some((node, depth)) = stack.pop() {
            let wildcard_allowed = !(depth == 0 && dollar);
            if wildcard_allowed {
                out.extend_from_slice(&node.value.multi);
            }
            let Some(level) = levels.get(depth) else {
                out.extend_from_slice(&node.value.exact);
                continue;
            };
            if let Some(child) = node.children.get(*level) {
                stack.push((child, depth + 1));
            }
            if wildcard_allowed {
                if let Some(child) = node.children.get("+") {
                    stack.push((child, depth + 1));
                }
            }
        }
        if out.len() > 1 {
            out.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
            out.dedup_by_key(|(k, _)| *k);
        }
    }
}

/// Values (the retained messages) by topic name, found with a filter.
#[derive(Debug)]
pub struct RetainedTree<V> {
    trie: LevelTrie<Option<V>>,
    len: usize,
}

impl<V> Default for RetainedTree<V> {
    fn default() -> Self {
        RetainedTree {
            trie: LevelTrie::new(),
            len: 0,
        }
    }
}

impl<V> RetainedTree<V> {
    /// An empty tree.
    pub fn new() -> Self {
        Self::default()
    }

    /// Names held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Nothing held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Put `value` under `name`; the value it replaces.
    pub fn insert(&mut self, name: &str, value: V) -> Option<V> {
        let old = self.trie.entry(name.split('/')).replace(value);
        if old.is_none() {
            self.len += 1;
        }
        old
    }

    /// The value under `name`.
    pub fn get(&self, name: &str) -> Option<&V> {
        self.trie.get(name.split('/'))?.as_ref()
    }

    /// Take the value under `name` away.
    pub fn remove(&mut self, name: &str) -> Option<V> {
        let old = self.trie.get_mut(name.split('/'))?.take()?;
        self.len -= 1;
        let path: Vec<&str> = name.split('/').collect();
        self.trie.prune(&path, Option::is_none);
        Some(old)
    }

    /// Call `f` with each value whose name matches a valid `filter` (wildcards included, names beginning with `$`
    /// excluded from a leading wildcard [MQTT-4.7.2-1]) until it breaks. Returns how many nodes were visited: the
    /// cost of the search, which grows with what the filter can match, not with the size of the tree.
    pub fn for_each_match(&self, filter: &str, mut f: impl FnMut(&V) -> ControlFlow<()>) -> usize {
        let levels: Vec<&str> = filter.split('/').collect();
        let mut visited = 0;
        let mut stack = vec![(&self.trie.root, 0usize)];
        // Top-level children a leading wildcard may enter.
        let enter = |depth: usize, name: &str| depth > 0 || !name.starts_with('$');
        while let Some((node, depth)) = stack.pop() {
            visited += 1;
            let Some(&level) = levels.get(depth) else {
                if let Some(v) = &node.value {
                    if f(v).is_break() {
                        return visited;
                    }
                }
                continue;
            };
            match level {
                "#" => {
                    // This node (`a/#` matches `a`) and everything below it.
                    let mut below: Vec<&Node<Option<V>>> = vec![node];
                    let mut first = true;
                    while let Some(n) = below.pop() {
                        if !first {
                            visited += 1;
                        }
                        if let (false, Some(v)) = (first && depth == 0, &n.value) {
                            if f(v).is_break() {
                                return visited;
                            }
                        }
                        below.extend(
                            n.children
                                .iter()
                                .filter(|(k, _)| !first || enter(depth, k))
                                .map(|(_, c)| c),
                        );
                        first = false;
                    }
                }
                "+" => stack.extend(
                    node.children
                        .iter()
                        .filter(|(k, _)| enter(depth, k))
                        .map(|(_, c)| (c, depth + 1)),
                ),
                literal => {
                    if let Some(child) = node.children.get(literal) {
                        stack.push((child, depth + 1));
                    }
                }
            }
        }
        visited
    }
}

#[cfg(test)]
mod tests;
