//! The allow-list: the senders a receiver takes records from, as `NAME=KEY` lines (KEY = 64 hex digits of the
//! sender's X25519 public key). `#` starts a comment; blank lines are ignored.

use crate::crypto::{check_public, LowOrderKey};
use crate::wire::{key_id, KeyId};
use foldhash::{HashMap, HashMapExt};
use std::path::Path;
use transport_core::order::sender_id;

/// One allowed sender.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowedSender {
    /// Its name (`dev-N` for the suite's devices).
    pub name: String,
    /// The stable number orders from it are stored under.
    pub sender_id: u64,
    /// Its static X25519 public key.
    pub public: [u8; 32],
}

/// Why an allow-list was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllowListError {
    /// A line is not `NAME=KEY`.
    #[error("{source_name} line {line}: {reason}")]
    Line {
        /// The file or `--sender`.
        source_name: String,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// Two entries share something that must name one sender only: records or stored orders could not be told apart
    /// (the store applies an order once per (sender id, run, seq), so two devices with one sender id would see each
    /// other's orders as duplicates).
    #[error("{first} and {second} have the same {what}")]
    Duplicate {
        /// What they share: `name`, `public key`, `key id` (the first 8 bytes of the key) or `sender id`.
        what: &'static str,
        /// Where the first entry is, e.g. ``senders line 3 (`dev-2`)``.
        first: String,
        /// Where the second entry is.
        second: String,
    },
    /// A key of small order: X25519 with it gives zero whatever the secret, so it proves nothing.
    #[error("{entry}: {source}")]
    LowOrder {
        /// Where the entry is.
        entry: String,
        /// The refusal.
        source: LowOrderKey,
    },
    /// The file could not be read.
    #[error("{0}")]
    Io(String),
}

/// The senders a receiver accepts, in the order given.
#[derive(Debug, Clone, Default)]
pub struct AllowList {
    senders: Vec<AllowedSender>,
    by_key_id: HashMap<KeyId, usize>,
}

impl AllowList {
    /// Build from entries; names, public keys, key ids and sender ids must be unique, and no key of small order.
    pub fn new(senders: Vec<AllowedSender>) -> Result<AllowList, AllowListError> {
        let located = senders
            .into_iter()
            .enumerate()
            .map(|(i, s)| {
                let at = format!("entry {}", i + 1);
                (s, at)
            })
            .collect();
        AllowList::checked(located)
    }

    /// Build from entries, each with where it came from (for errors).
    fn checked(entries: Vec<(AllowedSender, String)>) -> Result<AllowList, AllowListError> {
        let at = |i: usize| format!("{} (`{}`)", entries[i].1, entries[i].0.name);
        let mut names = HashMap::with_capacity(entries.len());
        let mut publics = HashMap::with_capacity(entries.len());
        let mut by_key_id = HashMap::with_capacity(entries.len());
        let mut ids = HashMap::with_capacity(entries.len());
        for (i, (s, _)) in entries.iter().enumerate() {
            check_public(&s.public).map_err(|source| AllowListError::LowOrder {
                entry: at(i),
                source,
            })?;
            let clashes = [
                ("name", names.insert(s.name.as_str(), i)),
                ("public key", publics.insert(s.public, i)),
                ("key id", by_key_id.insert(key_id(&s.public), i)),
                ("sender id", ids.insert(s.sender_id, i)),
            ];
            if let Some((what, Some(j))) = clashes.into_iter().find(|(_, j)| j.is_some()) {
                return Err(AllowListError::Duplicate {
                    what,
                    first: at(j),
                    second: at(i),
                });
            }
        }
        let senders = entries.into_iter().map(|(s, _)| s).collect();
        Ok(AllowList { senders, by_key_id })
    }

    /// Parse `NAME=KEY` lines.
    pub fn parse(text: &str, source_name: &str) -> Result<AllowList, AllowListError> {
        AllowList::checked(parse_lines(text, source_name)?)
    }

    /// Read a file of `NAME=KEY` lines.
    pub fn load(path: &Path) -> Result<AllowList, AllowListError> {
        AllowList::checked(load_lines(path)?)
    }

    /// Build from command-line entries: each `NAME=KEY`, or `@FILE` for a file of them.
    pub fn from_args(args: &[String]) -> Result<AllowList, AllowListError> {
        let mut entries = Vec::new();
        for (i, arg) in args.iter().enumerate() {
            if let Some(path) = arg.strip_prefix('@') {
                entries.extend(load_lines(Path::new(path))?);
            } else {
                let entry = parse_entry(arg).map_err(|reason| AllowListError::Line {
                    source_name: "--sender".into(),
                    line: 1,
                    reason,
                })?;
                entries.push((entry, format!("--sender {}", i + 1)));
            }
        }
        AllowList::checked(entries)
    }

    /// The entries as `NAME=KEY` lines.
    pub fn to_text(&self) -> String {
        self.senders
            .iter()
            .map(|s| format!("{}={}\n", s.name, hex::encode(s.public)))
            .collect()
    }

    /// The sender a key id names, with its position in the list.
    pub fn find(&self, id: &KeyId) -> Option<(usize, &AllowedSender)> {
        self.by_key_id.get(id).map(|&i| (i, &self.senders[i]))
    }

    /// The entries, in order.
    pub fn senders(&self) -> &[AllowedSender] {
        &self.senders
    }

    /// How many senders.
    pub fn len(&self) -> usize {
        self.senders.len()
    }

    /// Whether the list is empty.
    pub fn is_empty(&self) -> bool {
        self.senders.is_empty()
    }
}

/// The entries of `NAME=KEY` lines, each with its line (`SOURCE line N`).
fn parse_lines(
    text: &str,
    source_name: &str,
) -> Result<Vec<(AllowedSender, String)>, AllowListError> {
    let mut entries = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let entry = parse_entry(line).map_err(|reason| AllowListError::Line {
            source_name: source_name.to_string(),
            line: i + 1,
            reason,
        })?;
        entries.push((entry, format!("{source_name} line {}", i + 1)));
    }
    Ok(entries)
}

fn load_lines(path: &Path) -> Result<Vec<(AllowedSender, String)>, AllowListError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| AllowListError::Io(format!("{}: {e}", path.display())))?;
    parse_lines(&text, &path.display().to_string())
}

fn parse_entry(line: &str) -> Result<AllowedSender, String> {
    let (name, key) = line.split_once('=').ok_or("expected NAME=KEY")?;
    let name = name.trim();
    if name.is_empty() {
        return Err("empty sender name".into());
    }
    let public = transport_core::keys::parse_key32(key.trim())?;
    Ok(AllowedSender {
        name: name.to_string(),
        sender_id: sender_id(name),
        public,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_finds_by_key_id() {
        let k1 = hex::encode([1u8; 32]);
        let k2 = hex::encode([2u8; 32]);
        let list = AllowList::parse(
            &format!("# devices\ndev-1={k1}\n\n dev-2 = {k2} # second\n"),
            "f",
        )
        .unwrap();
        assert_eq!(list.len(), 2);
        let (i, s) = list.find(&[2; 8]).unwrap();
        assert_eq!((i, s.name.as_str(), s.sender_id), (1, "dev-2", 2));
        assert!(list.find(&[3; 8]).is_none());
    }

    fn key(b: u8) -> String {
        hex::encode([b; 32])
    }

    #[test]
    fn bad_lines_are_refused_with_their_line() {
        let e = AllowList::parse("dev-1\n", "senders").unwrap_err();
        assert!(e.to_string().contains("senders line 1"), "{e}");
        assert!(AllowList::parse("dev-1=zz\n", "f").is_err());
    }

    #[test]
    fn duplicates_are_refused_naming_both_lines() {
        let (k1, k2) = (key(1), key(2));
        let cases = [
            (
                format!("a={k1}\n# x\nb={k1}\n"),
                "public key",
                "a",
                1,
                "b",
                3,
            ),
            (format!("a={k1}\na={k2}\n"), "name", "a", 1, "a", 2),
            // Two keys sharing their first 8 bytes would be one key id in record headers.
            (
                format!("a={k1}\nb={}{}\n", &k1[..16], &k2[16..]),
                "key id",
                "a",
                1,
                "b",
                2,
            ),
        ];
        for (text, what, a, la, b, lb) in cases {
            let e = AllowList::parse(&text, "senders").unwrap_err();
            assert_eq!(
                e.to_string(),
                format!(
                    "senders line {la} (`{a}`) and senders line {lb} (`{b}`) have the same {what}"
                ),
            );
        }
        let same_id = |name: &str, b: u8| AllowedSender {
            name: name.into(),
            sender_id: 7,
            public: [b; 32],
        };
        let e = AllowList::new(vec![same_id("p", 1), same_id("q", 2)]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "entry 1 (`p`) and entry 2 (`q`) have the same sender id"
        );
        // Across --sender arguments and files.
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("senders");
        std::fs::write(&file, format!("a={k1}\nb={k2}\n")).unwrap();
        let e =
            AllowList::from_args(&[format!("c={k2}"), format!("@{}", file.display())]).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "--sender 1 (`c`) and {} line 2 (`b`) have the same public key",
                file.display()
            )
        );
    }

    #[test]
    fn a_key_of_small_order_is_refused_at_load() {
        let mut p_plus_1 = [0xff; 32];
        p_plus_1[0] = 0xee;
        for low in [[0u8; 32], p_plus_1] {
            let e = AllowList::parse(&format!("ok={}\nbad={}\n", key(1), hex::encode(low)), "f")
                .unwrap_err();
            assert!(
                e.to_string()
                    .starts_with("f line 2 (`bad`): the key is a point of small order"),
                "{e}"
            );
        }
    }
}
