//! The allow-list: the senders a receiver takes records from, as `NAME=KEY` lines (KEY = 64 hex digits of the
//! sender's X25519 public key). `#` starts a comment; blank lines are ignored.

use crate::wire::{key_id, KeyId};
use std::collections::HashMap;
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
    /// Two entries share a name or a key id; records could not be told apart.
    #[error("senders `{0}` and `{1}` collide (same name or same key id)")]
    Collision(String, String),
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
    /// Build from entries; names and key ids must be unique.
    pub fn new(senders: Vec<AllowedSender>) -> Result<AllowList, AllowListError> {
        let mut by_key_id = HashMap::with_capacity(senders.len());
        let mut names = HashMap::with_capacity(senders.len());
        for (i, s) in senders.iter().enumerate() {
            if let Some(j) = by_key_id.insert(key_id(&s.public), i) {
                return Err(AllowListError::Collision(
                    senders[j].name.clone(),
                    s.name.clone(),
                ));
            }
            if let Some(j) = names.insert(s.name.as_str(), i) {
                return Err(AllowListError::Collision(
                    senders[j].name.clone(),
                    s.name.clone(),
                ));
            }
        }
        Ok(AllowList { senders, by_key_id })
    }

    /// Parse `NAME=KEY` lines.
    pub fn parse(text: &str, source_name: &str) -> Result<AllowList, AllowListError> {
        let mut senders = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            senders.push(parse_entry(line).map_err(|reason| AllowListError::Line {
                source_name: source_name.to_string(),
                line: i + 1,
                reason,
            })?);
        }
        AllowList::new(senders)
    }

    /// Read a file of `NAME=KEY` lines.
    pub fn load(path: &Path) -> Result<AllowList, AllowListError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| AllowListError::Io(format!("{}: {e}", path.display())))?;
        AllowList::parse(&text, &path.display().to_string())
    }

    /// Build from command-line entries: each `NAME=KEY`, or `@FILE` for a file of them.
    pub fn from_args(args: &[String]) -> Result<AllowList, AllowListError> {
        let mut senders = Vec::new();
        for arg in args {
            if let Some(path) = arg.strip_prefix('@') {
                senders.extend(AllowList::load(Path::new(path))?.senders);
            } else {
                senders.push(parse_entry(arg).map_err(|reason| AllowListError::Line {
                    source_name: "--sender".into(),
                    line: 1,
                    reason,
                })?);
            }
        }
        AllowList::new(senders)
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

    #[test]
    fn bad_lines_and_collisions_are_refused() {
        let k = hex::encode([1u8; 32]);
        let e = AllowList::parse("dev-1\n", "senders").unwrap_err();
        assert!(e.to_string().contains("senders line 1"), "{e}");
        assert!(AllowList::parse("dev-1=zz\n", "f").is_err());
        let e = AllowList::parse(&format!("a={k}\nb={k}\n"), "f").unwrap_err();
        assert_eq!(e, AllowListError::Collision("a".into(), "b".into()));
    }
}
