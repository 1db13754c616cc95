//! The crate's one cache type, a map bounded by its number of entries, and the Python
//! strings both native paths keep in one.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;

use pyo3::prelude::*;
use pyo3::types::PyString;

/// Entries each cache holds at most: a fleet repeats a few thousand windows, ratings and
/// texts per window, far below this.
pub const CACHE_LIMIT: usize = 65_536;

/// A map of at most `capacity` entries. Eviction rule: inserting a new key into a full cache
/// empties it first. What these caches hold repeats within a window, so a refill costs one
/// miss per entry still in use, and a hit pays for no bookkeeping (recency, counts).
pub struct BoundedCache<K, V> {
    entries: HashMap<K, V>,
    capacity: usize,
}

impl<K: Eq + Hash, V> BoundedCache<K, V> {
    pub fn new(capacity: usize) -> Self {
        assert!(capacity > 0, "a cache holds at least one entry");
        BoundedCache {
            entries: HashMap::new(),
            capacity,
        }
    }

    pub fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Eq + Hash + ?Sized,
    {
        self.entries.get(key)
    }

    pub fn insert(&mut self, key: K, value: V) {
        if self.entries.len() >= self.capacity && !self.entries.contains_key(&key) {
            self.entries.clear();
        }
        self.entries.insert(key, value);
    }

    pub fn clear(&mut self) {
        self.entries.clear();
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }
}

impl<K: Eq + Hash, V> Default for BoundedCache<K, V> {
    fn default() -> Self {
        BoundedCache::new(CACHE_LIMIT)
    }
}

/// Python strings made once per distinct text: the names a fleet repeats in every window.
#[derive(Default)]
pub struct PyStrings(BoundedCache<String, Py<PyString>>);

impl PyStrings {
    pub fn get<'py>(&mut self, py: Python<'py>, text: &str) -> Bound<'py, PyAny> {
        if let Some(found) = self.0.get(text) {
            return found.bind(py).clone().into_any();
        }
        let made = PyString::new(py, text);
        self.0.insert(text.to_owned(), made.clone().unbind());
        made.into_any()
    }
}

#[cfg(test)]
mod tests {
    use super::BoundedCache;

    #[test]
    fn keeps_what_fits() {
        let mut cache = BoundedCache::new(3);
        for (key, value) in [("a", 1), ("b", 2), ("c", 3)] {
            cache.insert(key.to_owned(), value);
        }
        assert_eq!(cache.len(), 3);
        assert_eq!(cache.get("a"), Some(&1));
        assert_eq!(cache.get("c"), Some(&3));
        assert_eq!(cache.get("d"), None);
    }

    #[test]
    fn a_new_key_in_a_full_cache_empties_it_first() {
        let mut cache = BoundedCache::new(2);
        cache.insert("a".to_owned(), 1);
        cache.insert("b".to_owned(), 2);
        cache.insert("c".to_owned(), 3);
        assert_eq!(cache.len(), 1);
        assert_eq!(cache.get("a"), None);
        assert_eq!(cache.get("b"), None);
        assert_eq!(cache.get("c"), Some(&3));
    }

    #[test]
    fn replacing_a_key_in_a_full_cache_keeps_the_others() {
        let mut cache = BoundedCache::new(2);
        cache.insert("a".to_owned(), 1);
        cache.insert("b".to_owned(), 2);
        cache.insert("b".to_owned(), 20);
        assert_eq!(cache.len(), 2);
        assert_eq!(cache.get("a"), Some(&1));
        assert_eq!(cache.get("b"), Some(&20));
    }

    #[test]
    fn clear_forgets_everything() {
        let mut cache = BoundedCache::new(4);
        cache.insert(vec![1_u8], "x");
        cache.clear();
        assert_eq!(cache.len(), 0);
        assert_eq!(cache.get(&[1_u8][..]), None);
    }
}
