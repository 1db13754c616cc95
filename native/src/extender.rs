//! The kube extender's NodeNames answers (scheduler_hooks/extender/wire_kube.py): filter and
//! prioritize answered from the raw request body, with no Python string per node name.
//!
//! `read_node_names` reads a request only when it is plainly what kube-scheduler sends with
//! `nodeCacheCapable: true`: a JSON object of exactly the keys `Pod` (any JSON value, handed
//! back as its bytes for Python to decode), `NodeNames` (an array of strings) and, optionally,
//! `Nodes` as null, each once. Anything else is None, and Python decodes the whole body as
//! before (which decides, and words any refusal).
//!
//! `FitPieces` mirrors one Python fit table (scheduler_hooks/cluster/placement.py `FitTable`):
//! per node the ready JSON pieces Python made (its HostPriority and, where the node fails, its
//! FailedNodes member), so every message stays Python's; this module only looks names up and
//! joins pieces. Python's `encode_filter_names` and `decide_prioritize_encoded` are the
//! definition: the answers here are the same bytes.

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString};
use serde::de::{Deserializer, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::pieces::{Record, Table};

/// The names of a request, decoded (escapes resolved), in order: one text, where each ends,
/// and whether it was written without escapes (then its text is its JSON string's content as
/// it stands: a JSON string without escapes holds no quote, backslash or control character).
#[derive(Default)]
pub struct Names {
    text: String,
    ends: Vec<(usize, bool)>,
}

/// A name, and whether its text is already a JSON string's content (`Names`).
#[derive(Clone, Copy, Default)]
pub struct Sent<'a> {
    pub text: &'a str,
    pub plain: bool,
}

impl Names {
    pub fn push(&mut self, name: &str, plain: bool) {
        self.text.push_str(name);
        self.ends.push((self.text.len(), plain));
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn iter(&self) -> impl Iterator<Item = Sent<'_>> {
        let mut start = 0;
        self.ends.iter().map(move |&(end, plain)| {
            let text = &self.text[start..end];
            start = end;
            Sent { text, plain }
        })
    }
}

/// One array item: borrowed from the body where it has no escape.
#[derive(Deserialize)]
struct Name<'a>(#[serde(borrow)] Cow<'a, str>);

impl<'de> Deserialize<'de> for Names {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct NamesVisitor;
        impl<'de> Visitor<'de> for NamesVisitor {
            type Value = Names;
            fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
                formatter.write_str("an array of strings")
            }
            fn visit_seq<S: SeqAccess<'de>>(self, mut seq: S) -> Result<Names, S::Error> {
                let mut names = Names::default();
                while let Some(Name(name)) = seq.next_element::<Name<'de>>()? {
                    names.push(&name, matches!(name, Cow::Borrowed(_)));
                }
                Ok(names)
            }
        }
        deserializer.deserialize_seq(NamesVisitor)
    }
}

/// ExtenderArgs as kube-scheduler sends it with `nodeCacheCapable: true`; an unknown or
/// repeated key fails (Python's case-insensitive reading then decides).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Args<'a> {
    #[serde(rename = "Pod", borrow)]
    pod: &'a RawValue,
    #[serde(rename = "Nodes", borrow, default)]
    nodes: Option<&'a RawValue>,
    #[serde(rename = "NodeNames")]
    names: Names,
}

/// (where the Pod's JSON lies in `body`, the names), or None when the body is not plainly a
/// NodeNames request (module doc).
pub fn read_args(body: &[u8]) -> Option<(std::ops::Range<usize>, Names)> {
    // Whole-body UTF-8 first: the scanner checks only the strings it decodes.
    let text = std::str::from_utf8(body).ok()?;
    let args: Args = serde_json::from_str(text).ok()?;
    if args.nodes.is_some() {
        return None;
    }
    let pod = args.pod.get();
    let start = pod.as_ptr() as usize - text.as_ptr() as usize;
    Some((start..start + pod.len(), args.names))
}

/// `text` as a JSON string, as orjson writes it: `"` and `\` escaped, control characters as
/// `\b \t \n \f \r` or `\u00xx`, everything else (non-ASCII, DEL, `/`) as it is.
pub fn write_string(out: &mut Vec<u8>, text: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push(b'"');
    let bytes = text.as_bytes();
    let mut start = 0;
    for (at, &byte) in bytes.iter().enumerate() {
        let short: &[u8] = match byte {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            0x00..=0x1f => b"",
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..at]);
        if short.is_empty() {
            out.extend_from_slice(b"\\u00");
            out.push(HEX[usize::from(byte >> 4)]);
            out.push(HEX[usize::from(byte & 0xf)]);
        } else {
            out.extend_from_slice(short);
        }
        start = at + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

/// A sent name as a JSON string: copied as it stands where it came without escapes.
fn write_sent(out: &mut Vec<u8>, name: Sent) {
    if name.plain {
        out.push(b'"');
        out.extend_from_slice(name.text.as_bytes());
        out.push(b'"');
    } else {
        write_string(out, name.text);
    }
}

/// `{"Host":<name>,"Score":<score>}` (json_pieces.host_piece).
fn write_host(out: &mut Vec<u8>, name: Sent, score: u32) {
    out.extend_from_slice(b"{\"Host\":");
    write_sent(out, name);
    out.extend_from_slice(b",\"Score\":");
    out.extend_from_slice(score.to_string().as_bytes());
    out.push(b'}');
}

/// One fit table's pieces by node name (module doc), stored for cold caches (pieces.rs); a
/// name it does not hold passes the filter and scores `neutral`. Each node has a slot, a small
/// number of its own (a forgotten node's is reused), to mark it listed once in an answer.
pub struct Pieces {
    table: Table,
    slots: u32,
    vacant: Vec<u32>,
    neutral: u32,
}

impl Pieces {
    pub fn new(neutral: u32) -> Self {
        Pieces {
            table: Table::default(),
            slots: 0,
            vacant: Vec::new(),
            neutral,
        }
    }

    pub fn len(&self) -> usize {
        self.table.len()
    }

    pub fn set(&mut self, name: &str, host: &[u8], failed: Option<&[u8]>) {
        let (slots, vacant) = (&mut self.slots, &mut self.vacant);
        self.table.set(name, host, failed, || {
            vacant.pop().unwrap_or_else(|| {
                *slots += 1;
                *slots - 1
            })
        });
    }

    pub fn forget(&mut self, name: &str) {
        if let Some(slot) = self.table.remove(name) {
            self.vacant.push(slot);
        }
    }

    /// The NodeNames-mode ExtenderFilterResult (wire_kube.encode_filter_names): every name
    /// that passes, as often as sent; each failing node's member once, in first-sent order.
    #[cfg(test)]
    pub fn filter(&self, names: &Names) -> Vec<u8> {
        let answer = self.filter_answer(names);
        let mut out = vec![0; answer.len()];
        answer.write(&mut out);
        out
    }

    /// `filter`'s answer before it is joined: its length is known before it is written (so
    /// Python's bytes object is written once, in place).
    pub fn filter_answer<'a>(&'a self, names: &Names) -> FilterAnswer<'a> {
        let mut passed = Vec::with_capacity(names.text.len() + 3 * names.len());
        let mut failed: Vec<&'a [u8]> = Vec::new();
        let mut listed: Vec<bool> = Vec::new();
        let each = |name: Sent, found: Option<Record<'a>>| match found {
            Some(Record {
                slot,
                failed: Some(member),
                ..
            }) => {
                if listed.is_empty() {
                    listed.resize(self.slots as usize, false);
                }
                if !listed[slot as usize] {
                    listed[slot as usize] = true;
                    failed.push(member);
                }
            }
            _ => {
                if !passed.is_empty() {
                    passed.push(b',');
                }
                write_sent(&mut passed, name);
            }
        };
        self.table
            .lookup_each(names.iter(), |name: &Sent| name.text, each);
        FilterAnswer { passed, failed }
    }

    /// The HostPriorityList (wire_kube.decide_prioritize_encoded): each name once, in
    /// first-sent order, with its node's piece, or the neutral score where it has none.
    pub fn prioritize<'n>(&self, names: &'n Names) -> Vec<u8> {
        let mut out = Vec::with_capacity(names.text.len() + 32 * names.len() + 2);
        out.push(b'[');
        let mut listed = vec![false; self.slots as usize];
        // Names no node has: a set of the request's own, so std's keyed hash (not `pieces::NameHasher`).
        let mut unknown: HashSet<&'n str> = HashSet::new();
        let each = |name: Sent<'n>, found: Option<Record>| match found {
            Some(record) => {
                if listed[record.slot as usize] {
                    return;
                }
                listed[record.slot as usize] = true;
                if out.len() > 1 {
                    out.push(b',');
                }
                out.extend_from_slice(record.host);
            }
            None => {
                if !unknown.insert(name.text) {
                    return;
                }
                if out.len() > 1 {
                    out.push(b',');
                }
                write_host(&mut out, name, self.neutral);
            }
        };
        self.table
            .lookup_each(names.iter(), |name: &Sent| name.text, each);
        out.push(b']');
        out
    }
}

/// An ExtenderFilterResult in parts: the passing names as a JSON array's content, and the
/// FailedNodes members (the table's own bytes).
pub struct FilterAnswer<'a> {
    passed: Vec<u8>,
    failed: Vec<&'a [u8]>,
}

const FILTER_HEAD: &[u8] = b"{\"Nodes\":null,\"NodeNames\":[";
const FILTER_FAILED: &[u8] = b"],\"FailedNodes\":{";
const FILTER_TAIL: &[u8] = b"},\"FailedAndUnresolvableNodes\":{},\"Error\":\"\"}";

impl FilterAnswer<'_> {
    pub fn len(&self) -> usize {
        let members: usize = self.failed.iter().map(|member| member.len()).sum();
        let commas = self.failed.len().saturating_sub(1);
        FILTER_HEAD.len() + self.passed.len() + FILTER_FAILED.len() + members + commas + FILTER_TAIL.len()
    }

    /// Writes the answer into `out`, exactly `len()` bytes.
    pub fn write(&self, out: &mut [u8]) {
        let mut at = 0;
        let mut put = |bytes: &[u8]| {
            out[at..at + bytes.len()].copy_from_slice(bytes);
            at += bytes.len();
        };
        put(FILTER_HEAD);
        put(&self.passed);
        put(FILTER_FAILED);
        for (index, member) in self.failed.iter().enumerate() {
            if index > 0 {
                put(b",");
            }
            put(member);
        }
        put(FILTER_TAIL);
    }
}

/// A HostPriorityList of every name once (first-sent order) at `score`: where no fit table
/// applies (wire_kube.encode_host_priorities with one score).
pub fn priorities(names: &Names, score: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(names.text.len() + 32 * names.len() + 2);
    out.push(b'[');
    let mut listed: HashSet<&str> = HashSet::with_capacity(names.len());
    for name in names.iter() {
        if listed.insert(name.text) {
            if out.len() > 1 {
                out.push(b',');
            }
            write_host(&mut out, name, score);
        }
    }
    out.push(b']');
    out
}

// -- Python --------------------------------------------------------------------------------

/// A request's NodeNames, read by `read_node_names`, undecoded until asked (`decode`).
#[pyclass(module = "gpumeter_native", frozen)]
pub struct NodeNames(Names);

#[pymethods]
impl NodeNames {
    fn __len__(&self) -> usize {
        self.0.len()
    }

    /// The names as Python strings (what decoding the body would have given).
    fn decode<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let strings: Vec<Bound<'py, PyString>> =
            self.0.iter().map(|name| PyString::new(py, name.text)).collect();
        PyList::new(py, strings)
    }
}

/// ``read_node_names(body)``: (the Pod's JSON bytes, its NodeNames), or None (module doc).
/// The GIL is released while the body is scanned (a large body is read on a worker thread).
#[pyfunction]
pub fn read_node_names<'py>(
    py: Python<'py>,
    body: &Bound<'py, PyBytes>,
) -> PyResult<Option<(Bound<'py, PyBytes>, NodeNames)>> {
    let bytes = body.as_bytes();
    let Some((pod, names)) = py.allow_threads(|| read_args(bytes)) else {
        return Ok(None);
    };
    Ok(Some((PyBytes::new(py, &bytes[pod]), NodeNames(names))))
}

/// ``priorities(names, score)``: every name once at ``score`` (module function `priorities`).
#[pyfunction(name = "priorities")]
pub fn py_priorities<'py>(py: Python<'py>, names: &Bound<'py, NodeNames>, score: u32) -> Bound<'py, PyBytes> {
    PyBytes::new(py, &priorities(&names.get().0, score))
}

/// One fit table's pieces (module doc), kept in step by placement.FitTable.
#[pyclass(module = "gpumeter_native")]
pub struct FitPieces(Pieces);

#[pymethods]
impl FitPieces {
    #[new]
    fn new(neutral: u32) -> Self {
        FitPieces(Pieces::new(neutral))
    }

    fn __len__(&self) -> usize {
        self.0.len()
    }

    /// Keep ``name``'s pieces; False (nothing kept) for a name with no UTF-8 form (a lone
    /// surrogate), which no request this module reads can carry.
    #[pyo3(signature = (name, host, failed))]
    fn set(&mut self, name: &Bound<'_, PyString>, host: &[u8], failed: Option<&[u8]>) -> bool {
        match name.to_str() {
            Ok(text) => {
                self.0.set(text, host, failed);
                true
            }
            Err(_) => false,
        }
    }

    fn forget(&mut self, name: &Bound<'_, PyString>) {
        if let Ok(text) = name.to_str() {
            self.0.forget(text);
        }
    }

    fn filter<'py>(&self, py: Python<'py>, names: &Bound<'py, NodeNames>) -> PyResult<Bound<'py, PyBytes>> {
        let answer = self.0.filter_answer(&names.get().0);
        PyBytes::new_with(py, answer.len(), |out| {
            answer.write(out);
            Ok(())
        })
    }

    fn prioritize<'py>(&self, py: Python<'py>, names: &Bound<'py, NodeNames>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.0.prioritize(&names.get().0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Names {
        let mut names = Names::default();
        for name in list {
            names.push(name, !name.contains(['"', '\\']));
        }
        names
    }

    #[test]
    fn reads_plain_node_names_requests() {
        let body = br#"{"Pod":{"metadata":{"name":"p"}},"Nodes":null,"NodeNames":["a","b\"c","\u00e9"]}"#;
        let (pod, read) = read_args(body).expect("plain request");
        assert_eq!(&body[pod], br#"{"metadata":{"name":"p"}}"#);
        let texts: Vec<&str> = read.iter().map(|name| name.text).collect();
        assert_eq!(texts, ["a", "b\"c", "é"]);
        let plain: Vec<bool> = read.iter().map(|name| name.plain).collect();
        assert_eq!(plain, [true, false, false]);
        let cases: [(&str, &[u8]); 10] = [
            (
                "Nodes given",
                br#"{"Pod":{},"Nodes":{"items":[]},"NodeNames":["a"]}"#,
            ),
            ("no NodeNames", br#"{"Pod":{}}"#),
            ("NodeNames null", br#"{"Pod":{},"NodeNames":null}"#),
            ("a number among the names", br#"{"Pod":{},"NodeNames":["a",1]}"#),
            ("no Pod", br#"{"NodeNames":["a"]}"#),
            ("lower-case key", br#"{"pod":{},"NodeNames":["a"]}"#),
            (
                "repeated key",
                br#"{"Pod":{},"NodeNames":["a"],"NodeNames":["b"]}"#,
            ),
            ("lone surrogate", br#"{"Pod":{},"NodeNames":["\ud800"]}"#),
            ("not UTF-8", b"{\"Pod\":{},\"NodeNames\":[\"\xff\"]}"),
            ("trailing text", br#"{"Pod":{},"NodeNames":[]} x"#),
        ];
        for (name, body) in cases {
            assert!(read_args(body).is_none(), "case {name:?}");
        }
        let (_, empty) = read_args(br#" {"NodeNames":[],"Pod":null} "#).expect("empty");
        assert_eq!(empty.len(), 0);
    }

    #[test]
    fn writes_strings_as_orjson_does() {
        let cases: [(&str, &str); 6] = [
            ("node-1", "\"node-1\""),
            ("q\"b\\s", r#""q\"b\\s""#),
            ("\n\r\t\u{8}\u{c}", r#""\n\r\t\b\f""#),
            ("\u{0}\u{1b}\u{1f}", r#""\u0000\u001b\u001f""#),
            ("\u{7f}é/\u{2028}", "\"\u{7f}é/\u{2028}\""),
            ("", "\"\""),
        ];
        for (text, expected) in cases {
            let mut out = Vec::new();
            write_string(&mut out, text);
            assert_eq!(String::from_utf8(out).unwrap(), expected, "{text:?}");
        }
    }

    fn table() -> Pieces {
        let mut pieces = Pieces::new(5);
        pieces.set("a", br#"{"Host":"a","Score":9}"#, None);
        pieces.set("b", br#"{"Host":"b","Score":0}"#, Some(br#""b":"short""#));
        pieces.set("c", br#"{"Host":"c","Score":0}"#, Some(br#""c":"short""#));
        pieces
    }

    #[test]
    fn filters_and_prioritizes_from_the_pieces() {
        let mut pieces = table();
        let sent = names(&["b", "a", "x\"", "b", "a", "c"]);
        assert_eq!(
            String::from_utf8(pieces.filter(&sent)).unwrap(),
            r#"{"Nodes":null,"NodeNames":["a","x\"","a"],"FailedNodes":{"b":"short","c":"short"},"FailedAndUnresolvableNodes":{},"Error":""}"#
        );
        assert_eq!(
            String::from_utf8(pieces.prioritize(&sent)).unwrap(),
            r#"[{"Host":"b","Score":0},{"Host":"a","Score":9},{"Host":"x\"","Score":5},{"Host":"c","Score":0}]"#
        );
        assert_eq!(
            String::from_utf8(priorities(&sent, 0)).unwrap(),
            r#"[{"Host":"b","Score":0},{"Host":"a","Score":0},{"Host":"x\"","Score":0},{"Host":"c","Score":0}]"#
        );
        pieces.forget("b");
        pieces.set("d", br#"{"Host":"d","Score":1}"#, Some(br#""d":"short""#)); // takes b's slot
        pieces.set("c", br#"{"Host":"c","Score":7}"#, None);
        let sent = names(&["b", "d", "c", "d"]);
        assert_eq!(
            String::from_utf8(pieces.filter(&sent)).unwrap(),
            r#"{"Nodes":null,"NodeNames":["b","c"],"FailedNodes":{"d":"short"},"FailedAndUnresolvableNodes":{},"Error":""}"#
        );
        assert_eq!(pieces.len(), 3);
        let none = names(&[]);
        assert_eq!(
            String::from_utf8(pieces.filter(&none)).unwrap(),
            r#"{"Nodes":null,"NodeNames":[],"FailedNodes":{},"FailedAndUnresolvableNodes":{},"Error":""}"#
        );
        assert_eq!(pieces.prioritize(&none), b"[]");
    }
}
