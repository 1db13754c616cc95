//! The storage of the extender's fit pieces (extender.rs `Pieces`), laid out for cold caches.
//!
//! A filter or prioritize request looks up every node of the cluster once, and between two
//! requests the scheduler's own work evicts most of the table from the caches: the lookups
//! are cache misses, not hashing. So each node's name, host piece and FailedNodes piece lie
//! side by side in one arena (one record, usually one or two cache lines), found through a
//! compact open-addressing index of `u64`s (linear probing, power-of-two capacity, at most
//! half full): a lookup touches an index line and its record. `Table::lookup_each` looks up a
//! block of names at a time, prefetching every index line of the block, then every record,
//! before it reads any, so the block's misses overlap instead of following one another.
//!
//! An index entry is the name hash's low 32 bits (the fingerprint, whose low bits are also
//! the entry's home position) over the record's arena offset plus one; 0 is an empty entry.
//! A record is a 16-byte header (name, host and failed lengths, `NO_FAILED` for none, and the
//! node's slot, each a little-endian `u32`) then the three texts. Replacing a node's pieces
//! writes them in place where their lengths are unchanged, else appends a record and leaves
//! the old one as garbage; the arena is compacted when its garbage outweighs its live bytes.

use std::hash::Hasher;

/// The node-name hash of the index: wyhash's folded multiply (the 128-bit product's halves
/// xored) over at most two 8-byte loads per 16 bytes; ~1.5 ns a name where std's SipHash
/// takes ~12 (a third of the filter's lookups at 5,000 names). Unkeyed on purpose: the index
/// holds the cluster's node names, and a request's names are only looked up, never inserted,
/// so no request can lengthen the probes of another (the sets of a request's own names keep
/// std's keyed hash).
#[derive(Default)]
pub struct NameHasher(u64);

#[inline(always)]
fn fold(a: u64, b: u64) -> u64 {
    let product = u128::from(a ^ 0x243f_6a88_85a3_08d3) * u128::from(b ^ 0x9e37_79b9_7f4a_7c15);
    (product as u64) ^ ((product >> 64) as u64)
}

/// 0 to 8 bytes as one word (the first and last four, or three picked bytes, as wyhash does).
#[inline(always)]
fn load_short(bytes: &[u8]) -> u64 {
    let n = bytes.len();
    if n >= 4 {
        let low = u64::from(u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]));
        let high = u64::from(u32::from_le_bytes([
            bytes[n - 4],
            bytes[n - 3],
            bytes[n - 2],
            bytes[n - 1],
        ]));
        low | (high << 32)
    } else if n > 0 {
        u64::from(bytes[0]) | (u64::from(bytes[n / 2]) << 8) | (u64::from(bytes[n - 1]) << 16)
    } else {
        0
    }
}

#[inline(always)]
fn load8(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(word)
}

/// `a == b` without a call to libc's memcmp (most of a hot lookup's name check, names being
/// short): lengths, then 8-byte words, the last one overlapping; under 8 bytes, `load_short`'s
/// word, which holds every byte of a text that short.
#[inline(always)]
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    if n < 8 {
        return load_short(a) == load_short(b);
    }
    let mut at = 0;
    while at + 8 < n {
        if load8(a, at) != load8(b, at) {
            return false;
        }
        at += 8;
    }
    load8(a, n - 8) == load8(b, n - 8)
}

impl Hasher for NameHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut state = self.0 ^ bytes.len() as u64;
        let mut rest = bytes;
        while rest.len() > 16 {
            state = fold(state ^ load8(rest, 0), load8(rest, 8));
            rest = &rest[16..];
        }
        let (first, last) = if rest.len() >= 8 {
            (load8(rest, 0), load8(rest, rest.len() - 8))
        } else {
            (load_short(rest), 0)
        };
        self.0 = fold(state ^ first, last);
    }

    #[inline]
    fn write_u8(&mut self, byte: u8) {
        // str's Hash ends with a 0xff byte (`name_hash` writes it too, as str's Hash would).
        self.0 ^= u64::from(byte).rotate_left(40);
    }

    #[inline]
    fn finish(&self) -> u64 {
        fold(self.0, 0x1234_5678_9abc_def1)
    }
}

/// A name's hash: what `BuildHasherDefault<NameHasher>` gives for the `str`.
#[inline]
pub fn name_hash(name: &str) -> u64 {
    let mut hasher = NameHasher::default();
    hasher.write(name.as_bytes());
    hasher.write_u8(0xff);
    hasher.finish()
}

/// Asks the CPU to start loading the cache line of `at` (a hint: no fault, whatever `at` is).
#[inline(always)]
fn prefetch(at: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: prefetch only hints the cache; it never dereferences `at` (no fault, any address).
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(at.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}

/// One node's pieces as stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record<'a> {
    pub slot: u32,
    pub host: &'a [u8],
    pub failed: Option<&'a [u8]>,
}

const HEADER: usize = 16;
const NO_FAILED: u32 = u32::MAX;
const EMPTY: u64 = 0;
const MIN_CAPACITY: usize = 16;
/// Names looked up together by `lookup_each`: enough misses in flight to cover a memory
/// latency, few enough that the block's index and record lines stay in L1.
const BLOCK: usize = 16;

#[inline(always)]
fn fingerprint(hash: u64) -> u32 {
    hash as u32
}

#[inline(always)]
fn entry_fingerprint(entry: u64) -> u32 {
    (entry >> 32) as u32
}

#[inline(always)]
fn entry_offset(entry: u64) -> usize {
    (entry as u32 - 1) as usize
}

fn u32_of(value: usize) -> u32 {
    // The arena holds a cluster's pieces (a few MB at 15,000 nodes): 4 GiB is out of reach.
    u32::try_from(value).expect("fit pieces beyond 4 GiB")
}

/// Names to their pieces (module doc).
pub struct Table {
    arena: Vec<u8>,
    index: Vec<u64>,
    len: usize,
    /// Bytes of the arena no entry points to (replaced or forgotten records).
    garbage: usize,
}

impl Default for Table {
    fn default() -> Self {
        Table {
            arena: Vec::new(),
            index: vec![EMPTY; MIN_CAPACITY],
            len: 0,
            garbage: 0,
        }
    }
}

impl Table {
    pub fn len(&self) -> usize {
        self.len
    }

    #[inline(always)]
    fn mask(&self) -> usize {
        self.index.len() - 1
    }

    /// The record at `offset`: (its name, its pieces).
    #[inline(always)]
    fn record(&self, offset: usize) -> (&[u8], Record<'_>) {
        let (header, texts) = self.arena[offset..].split_at(HEADER);
        let header: &[u8; HEADER] = header.try_into().expect("a whole header");
        let word =
            |at: usize| u32::from_le_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]]);
        let (name_len, host_len, failed_len, slot) = (word(0) as usize, word(4) as usize, word(8), word(12));
        let (name, rest) = texts.split_at(name_len);
        let (host, rest) = rest.split_at(host_len);
        let failed = (failed_len != NO_FAILED).then(|| &rest[..failed_len as usize]);
        (name, Record { slot, host, failed })
    }

    fn record_size(&self, offset: usize) -> usize {
        let (name, record) = self.record(offset);
        HEADER + name.len() + record.host.len() + record.failed.map_or(0, <[u8]>::len)
    }

    /// The index position of `name`'s entry.
    fn find(&self, name: &str, hash: u64) -> Option<usize> {
        let (mask, wanted) = (self.mask(), fingerprint(hash));
        let mut at = wanted as usize & mask;
        loop {
            let entry = self.index[at];
            if entry == EMPTY {
                return None;
            }
            if entry_fingerprint(entry) == wanted
                && same_bytes(self.record(entry_offset(entry)).0, name.as_bytes())
            {
                return Some(at);
            }
            at = (at + 1) & mask;
        }
    }

    #[cfg(test)]
    pub fn get(&self, name: &str) -> Option<Record<'_>> {
        let at = self.find(name, name_hash(name))?;
        Some(self.record(entry_offset(self.index[at])).1)
    }

    /// Appends a record; its offset.
    fn append(&mut self, name: &str, host: &[u8], failed: Option<&[u8]>, slot: u32) -> usize {
        let offset = self.arena.len();
        self.arena.extend_from_slice(&u32_of(name.len()).to_le_bytes());
        self.arena.extend_from_slice(&u32_of(host.len()).to_le_bytes());
        let failed_len = failed.map_or(NO_FAILED, |bytes| u32_of(bytes.len()));
        assert!(
            failed_len != NO_FAILED || failed.is_none(),
            "a FailedNodes piece of 4 GiB"
        );
        self.arena.extend_from_slice(&failed_len.to_le_bytes());
        self.arena.extend_from_slice(&slot.to_le_bytes());
        self.arena.extend_from_slice(name.as_bytes());
        self.arena.extend_from_slice(host);
        self.arena.extend_from_slice(failed.unwrap_or_default());
        // The offset plus one is stored in an entry's low 32 bits.
        assert!(u32::try_from(self.arena.len()).is_ok(), "fit pieces beyond 4 GiB");
        offset
    }

    /// Keeps `name`'s pieces; a name not held yet gets the slot `new_slot` gives.
    pub fn set(&mut self, name: &str, host: &[u8], failed: Option<&[u8]>, new_slot: impl FnOnce() -> u32) {
        let hash = name_hash(name);
        if let Some(at) = self.find(name, hash) {
            let offset = entry_offset(self.index[at]);
            let (_, old) = self.record(offset);
            if old.host.len() == host.len() && old.failed.map(<[u8]>::len) == failed.map(<[u8]>::len) {
                // The same layout: written over (a score or reason of the same width).
                let host_at = offset + HEADER + name.len();
                let failed_at = host_at + host.len();
                self.arena[host_at..failed_at].copy_from_slice(host);
                if let Some(failed) = failed {
                    self.arena[failed_at..failed_at + failed.len()].copy_from_slice(failed);
                }
                return;
            }
            let (slot, size) = (old.slot, self.record_size(offset));
            let offset = self.append(name, host, failed, slot);
            self.index[at] = (self.index[at] & !u64::from(u32::MAX)) | (offset as u64 + 1);
            self.garbage += size;
            self.compact_if_wasteful();
            return;
        }
        if (self.len + 1) * 2 > self.index.len() {
            self.resize(self.index.len() * 2);
        }
        let offset = self.append(name, host, failed, new_slot());
        self.place(fingerprint(hash), offset);
        self.len += 1;
    }

    /// Puts an entry in the first empty position from its home (the name is not in the index).
    fn place(&mut self, fingerprint: u32, offset: usize) {
        let mask = self.mask();
        let mut at = fingerprint as usize & mask;
        while self.index[at] != EMPTY {
            at = (at + 1) & mask;
        }
        self.index[at] = (u64::from(fingerprint) << 32) | (offset as u64 + 1);
    }

    /// The index at `capacity` (a power of two) positions, its entries placed anew.
    fn resize(&mut self, capacity: usize) {
        let old = std::mem::replace(&mut self.index, vec![EMPTY; capacity]);
        for entry in old.into_iter().filter(|&entry| entry != EMPTY) {
            self.place(entry_fingerprint(entry), entry_offset(entry));
        }
    }

    /// Drops `name`; its slot, if it was held.
    pub fn remove(&mut self, name: &str) -> Option<u32> {
        let at = self.find(name, name_hash(name))?;
        let offset = entry_offset(self.index[at]);
        let slot = self.record(offset).1.slot;
        self.garbage += self.record_size(offset);
        self.len -= 1;
        // Backward-shift deletion: each later entry of the run moves into the hole when its
        // home is not after the hole, so every entry stays reachable from its home.
        let mask = self.mask();
        let mut hole = at;
        let mut next = (at + 1) & mask;
        loop {
            let entry = self.index[next];
            if entry == EMPTY {
                break;
            }
            let home = entry_fingerprint(entry) as usize & mask;
            if next.wrapping_sub(home) & mask >= next.wrapping_sub(hole) & mask {
                self.index[hole] = entry;
                hole = next;
            }
            next = (next + 1) & mask;
        }
        self.index[hole] = EMPTY;
        self.compact_if_wasteful();
        Some(slot)
    }

    fn compact_if_wasteful(&mut self) {
        if self.garbage > self.arena.len() - self.garbage {
            self.compact();
        }
    }

    /// Copies the live records into a new arena (in index order) and points the index there.
    fn compact(&mut self) {
        let mut arena = Vec::with_capacity(self.arena.len() - self.garbage);
        for at in 0..self.index.len() {
            let entry = self.index[at];
            if entry == EMPTY {
                continue;
            }
            let offset = entry_offset(entry);
            let size = self.record_size(offset);
            self.index[at] = (entry & !u64::from(u32::MAX)) | (arena.len() as u64 + 1);
            arena.extend_from_slice(&self.arena[offset..offset + size]);
        }
        self.arena = arena;
        self.garbage = 0;
    }

    /// Calls `each` with every item of `items` in order, its name's pieces alongside (None for
    /// a name not held), a block at a time (module doc: the block's cache misses overlap).
    #[inline]
    pub fn lookup_each<'a, T: Copy + Default>(
        &'a self,
        items: impl Iterator<Item = T>,
        name_of: impl Fn(&T) -> &str,
        mut each: impl FnMut(T, Option<Record<'a>>),
    ) {
        let mask = self.mask();
        let mut items = items.peekable();
        // Each item, its name's hash, the first index entry of the hash's fingerprint (or EMPTY).
        let mut block = [(T::default(), 0u64, EMPTY); BLOCK];
        while items.peek().is_some() {
            // 1: hash the block's names, prefetch their home index lines.
            let mut count = 0;
            for (slot, item) in block.iter_mut().zip(&mut items) {
                let hash = name_hash(name_of(&item));
                prefetch(self.index[fingerprint(hash) as usize & mask..].as_ptr().cast());
                *slot = (item, hash, EMPTY);
                count += 1;
            }
            let block = &mut block[..count];
            // 2: probe by fingerprint (index lines only), prefetch each candidate's record.
            for (_, hash, candidate) in block.iter_mut() {
                let wanted = fingerprint(*hash);
                let mut at = wanted as usize & mask;
                *candidate = loop {
                    let entry = self.index[at];
                    if entry == EMPTY || entry_fingerprint(entry) == wanted {
                        break entry;
                    }
                    at = (at + 1) & mask;
                };
                if *candidate != EMPTY {
                    let record = self.arena.as_ptr().wrapping_add(entry_offset(*candidate));
                    prefetch(record);
                    prefetch(record.wrapping_add(64));
                }
            }
            // 3: confirm the names (a fingerprint may be shared) and answer, in order.
            for &(item, hash, candidate) in block.iter() {
                let name = name_of(&item);
                let found = if candidate == EMPTY {
                    None
                } else {
                    let (held, record) = self.record(entry_offset(candidate));
                    if same_bytes(held, name.as_bytes()) {
                        Some(record)
                    } else {
                        // Another name of the same fingerprint first: the plain lookup (rare).
                        self.find(name, hash)
                            .map(|at| self.record(entry_offset(self.index[at])).1)
                    }
                };
                each(item, found);
            }
        }
    }
}

#[cfg(test)]
impl Table {
    /// Every entry reachable from its home without crossing an empty position, every record
    /// named by one entry, the counts right.
    fn check(&self) {
        let mask = self.mask();
        let mut held = 0;
        for (at, &entry) in self.index.iter().enumerate() {
            if entry == EMPTY {
                continue;
            }
            held += 1;
            let home = entry_fingerprint(entry) as usize & mask;
            let mut probe = home;
            while probe != at {
                assert_ne!(
                    self.index[probe], EMPTY,
                    "entry at {at} cut off from its home {home}"
                );
                probe = (probe + 1) & mask;
            }
            let (name, _) = self.record(entry_offset(entry));
            let name = std::str::from_utf8(name).unwrap();
            assert_eq!(entry_fingerprint(entry), fingerprint(name_hash(name)));
            assert_eq!(self.find(name, name_hash(name)), Some(at));
        }
        assert_eq!(held, self.len);
        assert!(self.len * 2 <= self.index.len(), "over half full");
        let live: usize = self
            .index
            .iter()
            .filter(|&&entry| entry != EMPTY)
            .map(|&entry| self.record_size(entry_offset(entry)))
            .sum();
        assert_eq!(live + self.garbage, self.arena.len());
        assert!(self.garbage <= live, "garbage {} over live {live}", self.garbage);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, HashMap, HashSet};
    use std::hash::BuildHasherDefault;

    /// A reference model: what each name holds.
    type Model = BTreeMap<String, (Vec<u8>, Option<Vec<u8>>, u32)>;

    fn assert_matches(table: &Table, model: &Model, absent: &[&str]) {
        table.check();
        assert_eq!(table.len(), model.len());
        for (name, (host, failed, slot)) in model {
            let expected = Record {
                slot: *slot,
                host,
                failed: failed.as_deref(),
            };
            assert_eq!(table.get(name), Some(expected), "{name:?}");
        }
        for name in absent {
            assert_eq!(table.get(name), None, "{name:?}");
        }
        // The batched lookup answers as `get` does, in order, across block boundaries.
        let mut asked: Vec<&str> = model.keys().map(String::as_str).collect();
        asked.extend_from_slice(absent);
        asked.extend(model.keys().rev().map(String::as_str));
        let mut answered = Vec::new();
        table.lookup_each(
            asked.iter().copied(),
            |name: &&str| *name,
            |name, found| answered.push((name, found)),
        );
        let expected: Vec<_> = asked.iter().map(|&name| (name, table.get(name))).collect();
        assert_eq!(answered, expected);
    }

    fn set(
        table: &mut Table,
        model: &mut Model,
        next: &mut u32,
        name: &str,
        host: &[u8],
        failed: Option<&[u8]>,
    ) {
        table.set(name, host, failed, || {
            *next += 1;
            *next - 1
        });
        let slot = model.get(name).map_or(*next - 1, |held| held.2);
        model.insert(name.to_owned(), (host.to_vec(), failed.map(<[u8]>::to_vec), slot));
    }

    /// Names of `count` distinct ones whose home is `home` in an index of `capacity`.
    fn homed_at(home: usize, capacity: usize, count: usize, stem: &str) -> Vec<String> {
        (0..)
            .map(|i| format!("{stem}{i}"))
            .filter(|name| fingerprint(name_hash(name)) as usize & (capacity - 1) == home)
            .take(count)
            .collect()
    }

    #[test]
    fn colliding_names_probe_past_each_other_and_deletion_keeps_runs_whole() {
        // 7 nodes in the smallest index (16): 4 homed at 14 wrap around the end past 5 and 0,
        // where 3 others are homed, so the runs overlap and wrap.
        let mut at_14 = homed_at(14, MIN_CAPACITY, 4, "a");
        at_14.extend(homed_at(15, MIN_CAPACITY, 1, "b"));
        let at_0 = homed_at(0, MIN_CAPACITY, 2, "c");
        let (mut table, mut model, mut next) = (Table::default(), Model::new(), 0);
        for name in at_14.iter().chain(&at_0) {
            set(&mut table, &mut model, &mut next, name, name.as_bytes(), None);
        }
        assert_eq!(table.index.len(), MIN_CAPACITY, "still the tiny index");
        let absent = homed_at(14, MIN_CAPACITY, 6, "a");
        assert_matches(&table, &model, &[&absent[4], &absent[5], "none"]);
        // Remove from the middle, the start and the end of the run, checking each time.
        for name in [&at_14[1], &at_14[0], &at_0[1], &at_14[4]] {
            let slot = model.remove(name.as_str()).unwrap().2;
            assert_eq!(table.remove(name), Some(slot));
            assert_eq!(table.remove(name), None);
            assert_matches(&table, &model, &[name]);
        }
        // Re-added: found again, a new slot from the caller.
        set(&mut table, &mut model, &mut next, &at_14[1], b"back", Some(b"x"));
        assert_matches(&table, &model, &[&at_14[0]]);
        assert_eq!(table.get(&at_14[1]).unwrap().slot, 7);
    }

    #[test]
    fn a_shared_fingerprint_is_told_apart_by_the_name() {
        // Two names whose hashes share their low 32 bits (a birthday search over 2^18 names).
        let mut seen: HashMap<u32, String> = HashMap::new();
        let (first, second) = (0..)
            .find_map(|i| {
                let name = format!("node-{i}");
                let fingerprint = fingerprint(name_hash(&name));
                seen.insert(fingerprint, name.clone()).map(|other| (other, name))
            })
            .unwrap();
        let (mut table, mut model, mut next) = (Table::default(), Model::new(), 0);
        set(&mut table, &mut model, &mut next, &first, b"first", None);
        assert_matches(&table, &model, &[&second]);
        set(&mut table, &mut model, &mut next, &second, b"second", Some(b"f"));
        assert_matches(&table, &model, &[]);
        assert_eq!(table.remove(&first), Some(0));
        assert_matches(
            &table,
            &[(second.clone(), model[&second].clone())].into(),
            &[&first],
        );
    }

    #[test]
    fn churn_replaces_forgets_and_compacts() {
        let (mut table, mut model, mut next) = (Table::default(), Model::new(), 0);
        let mut vacant = Vec::new();
        let names: Vec<String> = (0..300).map(|i| format!("gpu-node-{i:04}")).collect();
        let mut compacted = 0;
        for round in 0..12u32 {
            for (i, name) in names.iter().enumerate() {
                let mixed = (i as u32)
                    .wrapping_mul(2_654_435_761)
                    .wrapping_add(round * 40_503)
                    % 7;
                if mixed == 0 && model.contains_key(name) {
                    let slot = table.remove(name).unwrap();
                    assert_eq!(model.remove(name).unwrap().2, slot);
                    vacant.push(slot);
                    continue;
                }
                // Pieces of changing widths (appended) or the same width (written over).
                let host = format!("{{\"Host\":\"{name}\",\"Score\":{}}}", (round + mixed) % 11);
                let failed =
                    (mixed % 2 == 1).then(|| format!("\"{name}\":\"{}\"", "x".repeat(mixed as usize)));
                let garbage = table.garbage;
                let reused = vacant.last().copied();
                table.set(
                    name,
                    host.as_bytes(),
                    failed.as_ref().map(String::as_bytes),
                    || {
                        vacant.pop().unwrap_or_else(|| {
                            next += 1;
                            next - 1
                        })
                    },
                );
                if table.garbage < garbage {
                    compacted += 1;
                }
                let slot = model
                    .get(name)
                    .map(|held| held.2)
                    .unwrap_or_else(|| reused.unwrap_or(next - 1));
                model.insert(
                    name.clone(),
                    (host.into_bytes(), failed.map(String::into_bytes), slot),
                );
            }
            let absent: Vec<&str> = names
                .iter()
                .map(String::as_str)
                .filter(|name| !model.contains_key(*name))
                .collect();
            assert_matches(&table, &model, &absent);
        }
        assert!(compacted > 0, "the churn never compacted the arena");
        // Slots stay distinct among the held names.
        let slots: HashSet<u32> = model.values().map(|held| held.2).collect();
        assert_eq!(slots.len(), model.len());
    }

    #[test]
    fn same_bytes_is_equality() {
        let text: Vec<u8> = (0..40u8).map(|i| b'a' + i % 26).collect();
        for len in 0..=text.len() {
            let a = &text[..len];
            assert!(same_bytes(a, a), "{len}");
            assert!(
                !same_bytes(a, &text[..len.saturating_sub(1)]) || len == 0,
                "{len}"
            );
            for at in 0..len {
                let mut b = a.to_vec();
                b[at] ^= 0x20;
                assert!(!same_bytes(a, &b), "{len} differing at {at}");
            }
        }
    }

    #[test]
    fn node_names_hash_apart() {
        use std::hash::BuildHasher;
        let build = BuildHasherDefault::<NameHasher>::default();
        let mut hashes = HashSet::new();
        let mut buckets = HashSet::new();
        let lengths = [
            "a",
            "node-1",
            "node-0000001",
            "gpu-node-0000000001",
            "rack-7/gpu-node-00000000000000000001",
        ];
        for stem in lengths {
            for i in 0..2000 {
                let name = format!("{stem}{i}");
                let hash = build.hash_one(name.as_str());
                assert_eq!(hash, name_hash(&name));
                hashes.insert(hash);
                buckets.insert((stem, hash & 4095));
            }
        }
        // Every name its own hash; names differing in their last characters spread over the
        // buckets (low bits) as random hashes would (~1,600 of 4,096 for 2,000 names each).
        assert_eq!(hashes.len(), 10_000);
        assert!(buckets.len() > 5 * 1_400, "{} buckets", buckets.len());
    }
}
