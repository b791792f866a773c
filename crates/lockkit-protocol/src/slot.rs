//! Redis Cluster key slots: CRC16 (XMODEM) of the key's hash tag, modulo 16384.

use crate::keys::hash_tag;

/// Number of slots in a Redis Cluster.
pub const SLOTS: u16 = 16384;

/// CRC16/XMODEM (polynomial 0x1021, initial value 0), the checksum Redis Cluster uses.
///
/// ```
/// // The check value of CRC16/XMODEM, also given in the Redis Cluster specification.
/// assert_eq!(lockkit_protocol::slot::crc16(b"123456789"), 0x31C3);
/// ```
pub fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The cluster slot of a key or a (sharded) channel name.
///
/// ```
/// use lockkit_protocol::slot::key_slot;
/// assert_eq!(key_slot("{user1000}.following"), key_slot("{user1000}.followers"));
/// ```
pub fn key_slot(key: impl AsRef<[u8]>) -> u16 {
    crc16(hash_tag(key.as_ref())) % SLOTS
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{Kind, Namespace};

    #[test]
    fn known_slots() {
        // Values as `CLUSTER KEYSLOT` reports them.
        assert_eq!(key_slot("foo"), 12182);
        assert_eq!(key_slot("bar"), 5061);
        assert_eq!(key_slot("{foo}bar"), 12182);
        assert_eq!(key_slot("foo{}{bar}"), crc16(b"foo{}{bar}") % SLOTS);
    }

    /// Every key and channel of every primitive lands in the slot of its name's tag.
    #[test]
    fn every_key_of_an_object_shares_one_slot() {
        let ns = Namespace::default();
        let names = [
            "order:42",
            "cart:{u1}",
            "}x",
            "a{}b",
            "ünïcødé",
            "x\0y",
            "{",
            "}",
        ];
        for kind in Kind::ALL {
            for name in names {
                let keys = ns.object(kind, name).expect("valid name");
                let slot = key_slot(&keys.key);
                assert_eq!(key_slot(&keys.channel), slot, "{kind:?} {name:?}");
                assert_eq!(keys.keys.len(), 1 + kind.aux_suffixes().len());
                for key in &keys.keys {
                    assert_eq!(key_slot(key), slot, "{kind:?} {name:?} {key}");
                }
            }
        }
    }
}
