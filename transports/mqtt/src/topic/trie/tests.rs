use super::*;
use crate::topic::matches;

const FILTERS: [&str; 14] = [
    "#", "+", "a", "a/#", "a/+", "a/b", "+/b", "+/+", "a/+/c", "/+", "+/#", "$SYS/#", "a//b",
    "a/b/#",
];
const NAMES: [&str; 10] = [
    "a", "a/b", "a/c", "b/b", "/x", "a/b/c", "$SYS/x", "a//b", "/", "x",
];

#[test]
fn tree_agrees_with_matches() {
    let (filters, names) = (FILTERS, NAMES);
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
    assert!(tree.is_empty() && tree.trie.root.children.is_empty());
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

#[test]
fn the_retained_tree_agrees_with_matches() {
    let mut tree = RetainedTree::new();
    for (i, name) in NAMES.iter().enumerate() {
        assert!(tree.insert(name, i).is_none());
    }
    assert_eq!(tree.insert("a", 0), Some(0), "replaces");
    assert_eq!(tree.len(), NAMES.len());
    for filter in FILTERS
        .iter()
        .chain(&["$SYS/+", "+/+/+", "a/b/c/#", "nothing"])
    {
        let mut got = Vec::new();
        tree.for_each_match(filter, |&i| {
            got.push(i);
            std::ops::ControlFlow::Continue(())
        });
        got.sort();
        let want: Vec<usize> = (0..NAMES.len())
            .filter(|&i| matches(filter, NAMES[i]))
            .collect();
        assert_eq!(got, want, "{filter}");
    }
    for name in NAMES {
        assert!(tree.get(name).is_some());
        assert!(tree.remove(name).is_some());
        assert!(tree.remove(name).is_none());
    }
    assert!(
        tree.is_empty() && tree.trie.root.children.is_empty(),
        "pruned"
    );
}

#[test]
fn a_retained_search_costs_what_the_filter_can_match_not_the_size_of_the_tree() {
    let mut tree = RetainedTree::new();
    for i in 0..10_000 {
        tree.insert(&format!("r/{i}/v"), i);
    }
    let mut found = 0;
    let visited = tree.for_each_match("r/77/v", |_| {
        found += 1;
        std::ops::ControlFlow::Continue(())
    });
    assert_eq!((found, visited), (1, 4), "root, r, 77, v");
    assert_eq!(tree.for_each_match("x/+/v", |_| unreachable!()), 1);
    // A caller that has enough stops the walk.
    let mut taken = 0;
    tree.for_each_match("r/#", |_| {
        taken += 1;
        if taken == 10 {
            std::ops::ControlFlow::Break(())
        } else {
            std::ops::ControlFlow::Continue(())
        }
    });
    assert_eq!(taken, 10);
}

/// 65,000 levels, the most a 65,535-byte filter can hold: inserting, matching, removing and dropping must not
/// recurse (a recursive walk overflows a 2 MiB thread stack here).
#[test]
fn trees_as_deep_as_a_string_allows_are_walked_without_recursion() {
    let deep = "/".repeat(65_000);
    let filter = format!("{deep}#");
    let mut subs = SubscriptionTree::new();
    subs.insert(&filter, 1u32, QoS::AtMostOnce);
    subs.insert(&deep, 2u32, QoS::AtLeastOnce);
    let mut out = Vec::new();
    subs.matching(&deep, &mut out);
    assert_eq!(out, [(1, QoS::AtMostOnce), (2, QoS::AtLeastOnce)]);
    assert!(subs.remove(&filter, 1));
    assert!(subs.remove(&deep, 2));
    assert!(subs.is_empty() && subs.trie.root.children.is_empty());
    subs.insert(&filter, 3, QoS::AtMostOnce);
    drop(subs);

    let mut retained = RetainedTree::new();
    retained.insert(&deep, 1u32);
    let mut found = 0;
    retained.for_each_match(&filter, |_| {
        found += 1;
        std::ops::ControlFlow::Continue(())
    });
    assert_eq!(found, 1);
    assert_eq!(retained.remove(&deep), Some(1));
    retained.insert(&deep, 2);
    drop(retained);
}
