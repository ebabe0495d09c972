//! Rendezvous (highest random weight) hashing: which member owns a key.
//!
//! Every member scores every key; the highest score owns it. When a member
//! leaves, only its keys move (each to its own runner-up); when one joins,
//! it takes from each of the others the keys it now outscores, about
//! 1/(n+1) of all keys. No ring, no virtual nodes, no state beyond the
//! member set.
//!
//! The scores are part of the protocol between replicas, which may run
//! different builds during a rolling upgrade: they come from FNV-1a and
//! splitmix64's finaliser, written out here, never from `std`'s hasher
//! (whose algorithm may change between Rust releases).

use std::fmt;
use std::sync::Arc;

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// FNV-1a, 64 bits, continued from `hash` over `bytes`.
fn fnv1a_from(mut hash: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// FNV-1a, 64 bits.
fn fnv1a(bytes: &[u8]) -> u64 {
    fnv1a_from(FNV_OFFSET, bytes)
}

/// splitmix64's finaliser: spreads every input bit over the output, which
/// FNV alone does poorly for short inputs.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A key's hash, computed once and scored against every member.
pub(crate) fn key_hash(key: &str) -> u64 {
    mix(fnv1a(key.as_bytes()))
}

/// [`key_hash`] of `namespace/name` (of `name` without a namespace),
/// without building the string: it runs for every trigger and hand-out.
pub(crate) fn object_hash(namespace: Option<&str>, name: &str) -> u64 {
    let hash = match namespace {
        Some(ns) => fnv1a_from(fnv1a_from(FNV_OFFSET, ns.as_bytes()), b"/"),
        None => FNV_OFFSET,
    };
    mix(fnv1a_from(hash, name.as_bytes()))
}

fn member_hash(id: &str) -> u64 {
    mix(fnv1a(id.as_bytes()) ^ 0x9e37_79b9_7f4a_7c15)
}

fn score(key: u64, member: u64) -> u64 {
    mix(key ^ member)
}

/// The member of `members` that owns `key`, by rendezvous hashing; `None`
/// when there are no members. Every replica computes the same answer from
/// the same set, whatever its order or duplicates.
///
/// The controller's key for an object is `namespace/name` (`name` for a
/// cluster-scoped object).
///
/// ```
/// use tokio_workqueue_kube::shard::owner;
///
/// let three = ["replica-0", "replica-1", "replica-2"];
/// let four = ["replica-0", "replica-1", "replica-2", "replica-3"];
/// let keys: Vec<String> = (0..10_000).map(|i| format!("default/cm-{i}")).collect();
/// // A fourth member takes about a quarter of the keys, and only those move.
/// let moved = keys
///     .iter()
///     .filter(|k| owner(k, &three) != owner(k, &four))
///     .inspect(|k| assert_eq!(owner(k, &four), Some("replica-3")))
///     .count();
/// assert!((moved as f64 / 10_000.0 - 0.25).abs() < 0.02);
/// assert_eq!(owner::<&str>("default/cm-0", &[]), None);
/// ```
pub fn owner<'a, S: AsRef<str>>(key: &str, members: &'a [S]) -> Option<&'a str> {
    let key = key_hash(key);
    members.iter().map(AsRef::as_ref).max_by(|a, b| {
        score(key, member_hash(a))
            .cmp(&score(key, member_hash(b)))
            // A tie (never seen in practice) goes to the smaller name,
            // the same on every replica.
            .then_with(|| b.cmp(a))
    })
}

/// One member, with its hash computed once.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Member {
    id: Arc<str>,
    hash: u64,
}

/// A set of members, sorted and without duplicates: a replica's view of
/// the group, or the set it acknowledged on its Lease.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct Members(Arc<[Member]>);

impl Members {
    pub(crate) fn new<S: Into<Arc<str>>>(ids: impl IntoIterator<Item = S>) -> Self {
        let mut ids: Vec<Arc<str>> = ids.into_iter().map(Into::into).collect();
        ids.sort_unstable();
        ids.dedup();
        Members(
            ids.into_iter()
                .map(|id| Member {
                    hash: member_hash(&id),
                    id,
                })
                .collect(),
        )
    }

    /// The owner of the key whose [`key_hash`] is `key`.
    pub(crate) fn owner(&self, key: u64) -> Option<&str> {
        self.0
            .iter()
            .max_by(|a, b| {
                score(key, a.hash)
                    .cmp(&score(key, b.hash))
                    .then_with(|| b.id.cmp(&a.id))
            })
            .map(|m| &*m.id)
    }

    /// Whether `key` is `id`'s under this set.
    pub(crate) fn gives(&self, key: u64, id: &str) -> bool {
        self.owner(key) == Some(id)
    }

    #[cfg(feature = "prometheus")]
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// The form written on a Lease: the identities, comma-separated.
    pub(crate) fn encode(&self) -> String {
        let ids: Vec<&str> = self.0.iter().map(|m| &*m.id).collect();
        ids.join(",")
    }

    /// Reads [`encode`](Self::encode)'s form; empty names are skipped.
    pub(crate) fn decode(text: &str) -> Self {
        Members::new(text.split(',').map(str::trim).filter(|s| !s.is_empty()))
    }
}

impl FromIterator<Arc<str>> for Members {
    fn from_iter<T: IntoIterator<Item = Arc<str>>>(ids: T) -> Self {
        Members::new(ids)
    }
}

impl fmt::Debug for Members {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set()
            .entries(self.0.iter().map(|m| &*m.id))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("ns-{}/object-{i}", i % 7)).collect()
    }

    #[test]
    fn members_and_the_free_function_agree() {
        let ids = ["c", "a", "b", "a"];
        let members = Members::new(ids);
        assert_eq!(members.encode(), "a,b,c");
        for key in keys(2_000) {
            assert_eq!(members.owner(key_hash(&key)), owner(&key, &ids));
        }
    }

    #[test]
    fn the_split_is_even() {
        let ids: Vec<String> = (0..5).map(|i| format!("replica-{i}")).collect();
        let mut counts = [0usize; 5];
        for key in keys(50_000) {
            let o = owner(&key, &ids).unwrap();
            counts[ids.iter().position(|i| i == o).unwrap()] += 1;
        }
        for c in counts {
            // 10,000 each expected; 3 % either way is far beyond chance.
            assert!((9_700..=10_300).contains(&c), "{counts:?}");
        }
    }

    #[test]
    fn a_leaving_member_moves_only_its_own_keys() {
        let four = Members::new(["a", "b", "c", "d"]);
        let three = Members::new(["a", "b", "d"]);
        let mut moved = 0;
        for key in keys(20_000).iter().map(|k| key_hash(k)) {
            let before = four.owner(key).unwrap();
            let after = three.owner(key).unwrap();
            if before != after {
                assert_eq!(before, "c");
                moved += 1;
            } else {
                assert_ne!(before, "c");
            }
        }
        assert!((4_700..=5_300).contains(&moved), "{moved}");
    }

    #[test]
    fn object_hashes_are_the_key_string_s() {
        assert_eq!(
            object_hash(Some("default"), "cm-0"),
            key_hash("default/cm-0")
        );
        assert_eq!(object_hash(None, "node-1"), key_hash("node-1"));
        assert_eq!(object_hash(Some(""), "x"), key_hash("/x"));
    }

    #[test]
    fn the_lease_form_round_trips() {
        let members = Members::new(["replica-2", "replica-0", "replica-1"]);
        assert_eq!(members.encode(), "replica-0,replica-1,replica-2");
        assert_eq!(Members::decode(&members.encode()), members);
        assert_eq!(Members::decode(""), Members::default());
        assert_eq!(Members::decode(" a,,b "), Members::new(["a", "b"]));
        assert_eq!(Members::default().owner(1), None);
    }

    #[test]
    fn scores_are_stable_across_builds() {
        // Pinned: replicas of different builds must agree on owners.
        let ids = ["replica-0", "replica-1", "replica-2"];
        let owners: Vec<&str> = (0..8)
            .map(|i| owner(&format!("default/cm-{i}"), &ids).unwrap())
            .collect();
        assert_eq!(owners, PINNED_OWNERS);
    }

    /// What this implementation gave when the protocol was first released;
    /// a change here breaks mixed-version groups.
    const PINNED_OWNERS: [&str; 8] = [
        "replica-1",
        "replica-1",
        "replica-1",
        "replica-0",
        "replica-0",
        "replica-0",
        "replica-2",
        "replica-1",
    ];
}
