//! Contract 1's per-sample field rules as `UsageSample` states them (gpumeter/core/models.py,
//! gpumeter/core/validation.py), and the names rated lines may carry.
//!
//! The limits are constants of this crate, which the module exposes (lib.rs) and
//! tests/unit/streams/test_native_limits.py holds equal to Python's, rather than arguments
//! Python passes in: each rule is code shaped by it (the tenant pattern is a byte loop, a
//! limit of 10^12 a count of digits), which a number passed in could not reshape, so a
//! changed rule needs a change here anyway and a failing test says which; and the checks
//! stay plain functions that `cargo test` runs without Python.

use crate::json::{decimal_text, integer};

/// `MAX_SAMPLE_BYTES`: a longer line goes to the Python path (which refuses it as `too_large`).
pub const MAX_SAMPLE_BYTES: usize = 64 * 1024;
/// `EventId`: 1 to this many characters.
pub const EVENT_ID_MAX_CHARS: usize = 128;
/// `NonEmpty` (cluster, node, namespace, pod, pod_uid): 1 to this many characters, at least one
/// not whitespace (its pattern).
pub const NAME_MAX_CHARS: usize = 253;
pub const NAME_PATTERN: &str = r"\S";
/// `TENANT_PATTERN`, as `tenant_ok` implements it.
pub const TENANT_PATTERN: &str = r"^[a-z0-9][a-z0-9-]{0,62}$";
const TENANT_MAX_BYTES: usize = 63;
/// `Int32`: a pod priority's range.
pub const PRIORITY_MIN: i64 = i32::MIN as i64;
pub const PRIORITY_MAX: i64 = i32::MAX as i64;
/// `UTILIZATION_LIMIT` (10^12) and `TELEMETRY_LIMIT` (10^32) as digits before the point.
pub const UTILIZATION_DIGITS: usize = 12;
pub const TELEMETRY_DIGITS: usize = 32;
/// `Kind` and `CapacityType`.
pub const KINDS: [&str; 4] = ["gpu", "cpu", "memory", "storage"];
pub const CAPACITY_TYPES: [&str; 3] = ["on-demand", "spot", "reserved"];

/// At most `limit` characters; the byte length answers for most texts without counting.
fn within_chars(text: &str, limit: usize) -> bool {
    text.len() <= limit || text.chars().count() <= limit
}

pub fn event_id_ok(text: &str) -> bool {
    !text.is_empty() && within_chars(text, EVENT_ID_MAX_CHARS)
}

pub fn name_ok(text: &str) -> bool {
    !text.is_empty() && within_chars(text, NAME_MAX_CHARS) && text.chars().any(|c| !c.is_whitespace())
}

pub fn tenant_ok(text: &str) -> bool {
    let bytes = text.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= TENANT_MAX_BYTES
        && (bytes[0].is_ascii_lowercase() || bytes[0].is_ascii_digit())
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
}

/// A pod priority from its JSON token: an integer within `Int32`.
pub fn priority(token: &str) -> Option<i32> {
    integer(token)
        .filter(|value| (PRIORITY_MIN..=PRIORITY_MAX).contains(value))
        .and_then(|value| i32::try_from(value).ok())
}

/// Utilization's decimal text from its JSON token, when plainly below `UTILIZATION_LIMIT`.
pub fn utilization(token: &str) -> Option<&str> {
    decimal_text(token, UTILIZATION_DIGITS)
}

/// Other telemetry's decimal text from its JSON token, when plainly below `TELEMETRY_LIMIT`.
pub fn telemetry(token: &str) -> Option<&str> {
    decimal_text(token, TELEMETRY_DIGITS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(rule: fn(&str) -> bool, cases: &[(&str, &str, bool)]) {
        for (name, text, expected) in cases {
            assert_eq!(rule(text), *expected, "case {name:?}: {text:?}");
        }
    }

    #[test]
    fn event_ids() {
        let longest = "é".repeat(128);
        let too_long = "x".repeat(129);
        check(
            event_id_ok,
            &[
                ("plain", "g-1", true),
                ("empty", "", false),
                ("128 two-byte characters", &longest, true),
                ("129 characters", &too_long, false),
                ("blank is allowed", " ", true),
            ],
        );
    }

    #[test]
    fn names() {
        let longest = "n".repeat(253);
        let longest_wide = "ü".repeat(253);
        let too_long = "n".repeat(254);
        check(
            name_ok,
            &[
                ("plain", "pod-1", true),
                ("inner spaces and non-ASCII", "pod ünïcode", true),
                ("empty", "", false),
                ("blank", " \t", false),
                ("only a line separator", "\u{2028}", false),
                ("253 characters", &longest, true),
                ("253 two-byte characters", &longest_wide, true),
                ("254 characters", &too_long, false),
            ],
        );
    }

    #[test]
    fn tenants() {
        let longest = format!("a{}", "-".repeat(62));
        let too_long = "a".repeat(64);
        check(
            tenant_ok,
            &[
                ("lowercase", "team-a", true),
                ("starts with a digit", "7eleven", true),
                ("one character", "a", true),
                ("63 characters", &longest, true),
                ("64 characters", &too_long, false),
                ("empty", "", false),
                ("uppercase", "Team-a", false),
                ("starts with a dash", "-team", false),
                ("underscore", "team_a", false),
                ("non-ASCII", "tëam", false),
            ],
        );
    }

    #[test]
    fn priorities() {
        let cases: [(&str, &str, Option<i32>); 10] = [
            ("zero", "0", Some(0)),
            ("negative zero", "-0", Some(0)),
            ("smallest", "-2147483648", Some(i32::MIN)),
            ("largest", "2147483647", Some(i32::MAX)),
            ("beyond int32", "2147483648", None),
            ("below int32", "-2147483649", None),
            ("beyond int64", "99999999999999999999", None),
            ("text", "\"5\"", None),
            ("float", "1.0", None),
            ("leading zero", "01", None),
        ];
        for (name, token, expected) in cases {
            assert_eq!(priority(token), expected, "case {name:?}");
        }
    }

    #[test]
    fn telemetry_limits() {
        let largest_energy = "9".repeat(32);
        let energy_limit = format!("1{}", "0".repeat(32));
        type Rule = fn(&str) -> Option<&str>;
        let cases: [(&str, Rule, &str, bool); 6] = [
            (
                "largest utilization",
                utilization,
                "\"999999999999.999999\"",
                true,
            ),
            (
                "utilization at its limit",
                utilization,
                "\"1000000000000\"",
                false,
            ),
            ("utilization as an integer", utilization, "1", true),
            ("largest energy", telemetry, &largest_energy, true),
            ("energy at its limit", telemetry, &energy_limit, false),
            ("negative", telemetry, "\"-1\"", false),
        ];
        for (name, rule, token, accepted) in cases {
            assert_eq!(rule(token).is_some(), accepted, "case {name:?}");
        }
    }
}
