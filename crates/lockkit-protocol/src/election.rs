//! The election: one leader at a time among candidates, announced with a value, fenced by its
//! term.
//!
//! An election's leadership **is** a fenced hold of its main key: the election's first five keys
//! ([`Kind::Election`](crate::keys::Kind::Election): main, `token`, `handoff`, `waiting`,
//! `timeouts`) have the fenced lock's layout, and the fenced lock's acquire, release, cancel and
//! force-unlock scripts ([`crate::fenced_lock`], [`crate::lock`]) run on them unchanged; its
//! renewal is the lock's, with the leader record following the hold ([`RENEW`]). So candidates
//! wait in FIFO order and are granted leadership directly by the previous leader's release,
//! every leadership has a lease of its own (watchdog or fixed), and the **term** is the hold's
//! fencing token: strictly increasing, never repeated, also after a restore from an older
//! snapshot.
//!
//! The sixth key, `<prefix>:election.leader:{name}`, is the **leader record**: a HASH with
//! `term`, `value`, `marker` (the leader's hold marker), `owner`, `version` and `request`. A new
//! leader writes it with [`PROCLAIM`] right after its election (and again to announce a new
//! value); [`RESIGN`] deletes it; [`LEADER`] reads it, and answers only while the record's hold is
//! live and carries the record's term (a leader that died leaves a record that names nobody).
//!
//! The record lives **exactly as long as the hold it names**: every proclaim sets it to expire
//! with the hold (`PEXPIREAT` the hold's own expiry), and the election's renewal ([`RENEW`], the
//! watchdog's `lock_renew` for the election's holds) moves the record's expiry with its hold's.
//! So a leader that leads for days without proclaiming keeps its record, and a leader that died
//! leaves none past its lease.
//!
//! Its `version` counts the announcements it carried, so that announcements of one term are
//! ordered: an observer that read the record can tell an older message of the same term (still in
//! flight when it read) from a newer one. Its `request` is the id of the proclaim call that wrote
//! it last: a proclaim re-sent after its reply was lost finds its own id there and changes and
//! publishes nothing (idempotent per request, as every script that may be re-sent).
//!
//! When no announced leader leads, [`LEADER`] answers with a position on the change channel
//! instead ([`Nobody`]): the term of a live hold that has not announced itself, or the token
//! counter when no hold is live. An observer whose read found nobody drops the messages published
//! before its read by that position, as it does by `(term, version)` when it found a leader.
//!
//! Changes are published on the election's **change channel** ([`changes_channel`], with the
//! election's hash tag, so a script may `SPUBLISH` it) as [`Change`] messages:
//! `l:<term>:<version>:<value>` and `r:<term>`.
//!
//! ```
//! use lockkit_protocol::election::{changes_channel, Change};
//! use lockkit_protocol::keys::{Kind, Namespace};
//!
//! let keys = Namespace::default().object(Kind::Election, "scheduler").unwrap();
//! assert_eq!(keys.aux("leader"), Some("lockkit:election.leader:{scheduler}"));
//! assert_eq!(changes_channel(&keys), "lockkit:election:{scheduler}:changes");
//! assert_eq!(
//!     Change::parse("l:17:1:pod-a:8080"),
//!     Some(Change::Announced { term: 17, version: 1, value: "pod-a:8080".into() })
//! );
//! assert_eq!(Change::parse("r:17"), Some(Change::Resigned { term: 17 }));
//! ```

use crate::keys::ObjectKeys;
use crate::script::{with_prelude, Script};
use crate::DecodeError;

/// The leader announces its value: after its election, and for every new value under the same
/// term. Replies `{1}` (done, or done already by an earlier send of the same request) or `{0}`
/// (not the leader any more); see [`decode_proclaim`].
pub static PROCLAIM: Script = with_prelude!(["hold_lib", "election_lib"], "election_proclaim");
/// The watchdog's renewal of leaderships: `lock_renew` on the election's keys (all six per hold),
/// and each leader record of a renewed hold expires with it. Replies as
/// [`lock::RENEW`](crate::lock::RENEW); see [`decode_renew`](crate::lock::decode_renew).
pub static RENEW: Script = with_prelude!(["hold_lib", "election_lib"], "election_renew");
/// The leader of a term steps down: its record goes and `r:<term>` is published. Replies `{1}`
/// or `{0}` (the record is another term's); see [`decode_resign`]. The hold itself is then given
/// back with the fenced lock's release.
pub static RESIGN: Script = with_prelude!(["hold_lib", "election_lib"], "election_resign");
/// Who leads: `{'1', term, version, value}`, or, when nobody announced leads, where the change
/// channel stands: `{'0', term, '0'}` (a live hold of `term` leads, unannounced) or
/// `{'0', term, '1'}` (no live hold; `term` is the token counter); an array of strings. Its keys
/// are the main key, the leader record and the token counter. See [`decode_read`].
pub static LEADER: Script = with_prelude!(["hold_lib", "election_lib"], "election_leader");

/// The change channel of the election with these keys: `<main key>:changes`.
pub fn changes_channel(keys: &ObjectKeys) -> String {
    format!("{}:changes", keys.key)
}

/// One message of an election's change channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// `l:<term>:<version>:<value>`: the leader of `term` announced `value` (a new term: it was
    /// elected; the same term again: it proclaimed a new value).
    Announced {
        /// The leader's term.
        term: u64,
        /// The leader record's version after this announcement: `(term, version)` orders
        /// announcements.
        version: u64,
        /// The announced value (may be empty, may contain `:`).
        value: String,
    },
    /// `r:<term>`: the leader of `term` resigned.
    Resigned {
        /// The term that ended.
        term: u64,
    },
}

impl Change {
    /// Reads a message of the change channel; `None` for anything else.
    pub fn parse(message: &str) -> Option<Change> {
        if let Some(rest) = message.strip_prefix("l:") {
            let (term, rest) = rest.split_once(':')?;
            let (version, value) = rest.split_once(':')?;
            return Some(Change::Announced {
                term: parse_term(term)?,
                version: parse_term(version)?,
                value: value.to_owned(),
            });
        }
        let term = message.strip_prefix("r:")?;
        Some(Change::Resigned {
            term: parse_term(term)?,
        })
    }

    /// The message's term.
    pub fn term(&self) -> u64 {
        match self {
            Change::Announced { term, .. } | Change::Resigned { term } => *term,
        }
    }
}

/// A term (or version) as the scripts write it: decimal digits only.
fn parse_term(text: &str) -> Option<u64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// Decodes [`PROCLAIM`]'s reply: whether the caller still leads (and so announced its value).
pub fn decode_proclaim(reply: &[i64]) -> Result<bool, DecodeError> {
    match reply {
        [1] => Ok(true),
        [0] => Ok(false),
        _ => Err(DecodeError::new("election_proclaim", reply)),
    }
}

/// Decodes [`RESIGN`]'s reply: whether the record was the caller's term (and was deleted).
pub fn decode_resign(reply: &[i64]) -> Result<bool, DecodeError> {
    match reply {
        [1] => Ok(true),
        [0] => Ok(false),
        _ => Err(DecodeError::new("election_resign", reply)),
    }
}

/// What [`LEADER`] read: the leader's term, the record's version and the announced value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The leader's term.
    pub term: u64,
    /// The record's version (see the module docs).
    pub version: u64,
    /// The announced value.
    pub value: String,
}

/// What [`LEADER`] read: the leader, or where the change channel stands when nobody announced
/// leads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaderRead {
    /// The leader's record (its hold is live and carries its term).
    Leads(Record),
    /// No leader has announced itself. Every announcement published before the read is at or
    /// before this position; every later one is after it (see [`Nobody::covers`]).
    Nobody(Nobody),
}

/// Where an election's change channel stood when [`LEADER`] found no announced leader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Nobody {
    /// `over: false`: the term of the live hold that leads without having announced itself (a
    /// new leader about to announce, or one that resigned and has not released its hold yet).
    /// `over: true`: the token counter (0 when it is gone); no hold was live.
    pub term: u64,
    /// Whether `term` itself is over: no live hold, so every announcement up to `term` was
    /// published before the read, and the next leader's term is greater.
    pub over: bool,
}

impl Nobody {
    /// Whether a message of `term` on the change channel was published before the read that
    /// returned this position: a smaller term always; `term` itself when it is over.
    pub fn covers(&self, term: u64) -> bool {
        term < self.term || (self.over && term == self.term)
    }
}

/// Decodes [`LEADER`]'s reply (an array of strings): the leader, or the position of the change
/// channel when nobody announced leads.
///
/// ```
/// use lockkit_protocol::election::{decode_read, LeaderRead, Nobody, Record};
/// let reply = ["1", "42", "3", "pod-a"].map(String::from);
/// let record = Record { term: 42, version: 3, value: "pod-a".into() };
/// assert_eq!(decode_read(&reply).unwrap(), LeaderRead::Leads(record));
/// let reply = ["0", "43", "0"].map(String::from);
/// let nobody = Nobody { term: 43, over: false };
/// assert_eq!(decode_read(&reply).unwrap(), LeaderRead::Nobody(nobody));
/// assert!(nobody.covers(42) && !nobody.covers(43));
/// ```
pub fn decode_read(reply: &[String]) -> Result<LeaderRead, DecodeError> {
    match reply {
        [flag, term, over] if flag == "0" => match (parse_term(term), over.as_str()) {
            (Some(term), "0" | "1") => Ok(LeaderRead::Nobody(Nobody {
                term,
                over: over == "1",
            })),
            _ => Err(leader_error(reply)),
        },
        [flag, term, version, value] if flag == "1" => {
            match (parse_term(term), parse_term(version)) {
                (Some(term), Some(version)) => Ok(LeaderRead::Leads(Record {
                    term,
                    version,
                    value: value.clone(),
                })),
                _ => Err(leader_error(reply)),
            }
        }
        _ => Err(leader_error(reply)),
    }
}

/// Decodes [`LEADER`]'s reply as [`decode_read`], keeping only the leader's record.
///
/// ```
/// use lockkit_protocol::election::{decode_leader, Record};
/// let reply = ["1", "42", "3", "pod-a"].map(String::from);
/// let record = Record { term: 42, version: 3, value: "pod-a".into() };
/// assert_eq!(decode_leader(&reply).unwrap(), Some(record));
/// assert_eq!(decode_leader(&["0", "41", "1"].map(String::from)).unwrap(), None);
/// ```
pub fn decode_leader(reply: &[String]) -> Result<Option<Record>, DecodeError> {
    Ok(match decode_read(reply)? {
        LeaderRead::Leads(record) => Some(record),
        LeaderRead::Nobody(_) => None,
    })
}

fn leader_error(reply: &[String]) -> DecodeError {
    DecodeError {
        script: "election_leader",
        detail: format!("{reply:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{Kind, Namespace};

    #[test]
    fn the_election_runs_the_fenced_lock_scripts_on_its_first_five_keys() {
        let fenced = Kind::FencedLock.aux_suffixes();
        let election = Kind::Election.aux_suffixes();
        assert_eq!(&election[..fenced.len()], fenced);
        assert_eq!(election.last(), Some(&"leader"));
    }

    #[test]
    fn the_change_channel_shares_the_elections_slot() {
        let keys = Namespace::default()
            .object(Kind::Election, "a:{t}")
            .unwrap();
        let channel = changes_channel(&keys);
        for key in &keys.keys {
            assert_eq!(crate::slot::key_slot(key), crate::slot::key_slot(&channel));
        }
        assert_ne!(channel, keys.channel);
    }

    #[test]
    fn change_messages_parse() {
        assert_eq!(
            Change::parse("l:5:1:"),
            Some(Change::Announced {
                term: 5,
                version: 1,
                value: String::new()
            })
        );
        assert_eq!(
            Change::parse("l:5:2:a:b"),
            Some(Change::Announced {
                term: 5,
                version: 2,
                value: "a:b".into()
            })
        );
        assert_eq!(Change::parse("r:9"), Some(Change::Resigned { term: 9 }));
        assert_eq!(Change::parse("r:9").map(|c| c.term()), Some(9));
        for bad in [
            "", "l:", "l:5", "l:5:v", "l:x:1:v", "l:5:x:v", "l:-1:1:v", "r:", "r:+1", "x:1",
            "r:1:2",
        ] {
            assert_eq!(Change::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn replies_decode() {
        assert_eq!(decode_proclaim(&[1]), Ok(true));
        assert_eq!(decode_proclaim(&[0]), Ok(false));
        assert!(decode_proclaim(&[2]).is_err());
        assert!(decode_proclaim(&[]).is_err());
        assert_eq!(decode_resign(&[1]), Ok(true));
        assert_eq!(decode_resign(&[0]), Ok(false));
        assert!(decode_resign(&[1, 1]).is_err());
        let s = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(decode_leader(&s(&["0", "7", "1"])), Ok(None));
        assert_eq!(
            decode_read(&s(&["0", "7", "0"])),
            Ok(LeaderRead::Nobody(Nobody {
                term: 7,
                over: false
            }))
        );
        assert_eq!(
            decode_read(&s(&["0", "0", "1"])),
            Ok(LeaderRead::Nobody(Nobody {
                term: 0,
                over: true
            }))
        );
        assert!(decode_read(&s(&["0"])).is_err());
        assert!(decode_read(&s(&["0", "7", "2"])).is_err());
        assert!(decode_read(&s(&["0", "x", "1"])).is_err());
        assert_eq!(
            decode_leader(&s(&["1", "7", "2", ""])),
            Ok(Some(Record {
                term: 7,
                version: 2,
                value: String::new()
            }))
        );
        assert!(decode_leader(&s(&["1", "x", "1", "v"])).is_err());
        assert!(decode_leader(&s(&["1", "7", "v"])).is_err());
        assert!(decode_leader(&s(&["1", "7"])).is_err());
        assert!(decode_leader(&s(&[])).is_err());
    }

    #[test]
    fn scripts_document_their_contract() {
        for script in [&PROCLAIM, &RESIGN, &LEADER, &RENEW] {
            let src = crate::lock::strip_preludes(script.source());
            assert_ne!(src, script.source(), "the helpers first");
            assert!(src.starts_with(&format!("-- {}:", script.name())));
            assert!(src.contains("KEYS[") && src.contains("Reply"));
        }
    }
}
