//! Failure fingerprints: what makes two failures "the same" for an operator. Ids, numbers
//! and hex strings are replaced by placeholders, so `order 123 not found (req 0x9f3a)` and
//! `order 456 not found (req 0x11b2)` are one group: `permanent: order <n> not found (req <hex>)`.

use crate::{ErrorClass, Message};

/// Longest normalised message kept in a fingerprint, in characters.
const MAX_CHARS: usize = 200;

/// The fingerprint of a failure: its class and its normalised message.
pub fn fingerprint(class: ErrorClass, message: Option<&str>) -> String {
    match message.map(normalize).filter(|m| !m.is_empty()) {
        Some(m) => format!("{}: {m}", class.as_str()),
        None => class.as_str().to_owned(),
    }
}

/// The fingerprint of a dead message (failure groups, dead-letter alerts): its last error's,
/// or its dead reason when it has no error (a message an operator killed before any failure:
/// `killed`).
pub fn of_dead(m: &Message) -> String {
    match &m.last_error {
        Some(e) => fingerprint(e.class, e.message.as_deref()),
        None => m.dead_reason.map_or("unknown", |r| r.as_str()).to_owned(),
    }
}

/// `message` with UUIDs as `<id>`, hex strings (`0x…`, or 8 or more hex digits with a
/// digit among them) as `<hex>`, and every other run of digits as `<n>`; whitespace
/// collapsed; at most 200 characters.
pub fn normalize(message: &str) -> String {
    let chars: Vec<char> = message.chars().collect();
    let mut out = String::with_capacity(message.len());
    let mut i = 0;
    let boundary = |j: usize| j >= chars.len() || !chars[j].is_ascii_alphanumeric();
    while i < chars.len() {
        let c = chars[i];
        let starts_word = i == 0 || !chars[i - 1].is_ascii_alphanumeric();
        if starts_word && is_uuid(&chars[i..]) && boundary(i + 36) {
            out.push_str("<id>");
            i += 36;
            continue;
        }
        if c.is_ascii_alphanumeric() {
            let end = (i..chars.len())
                .find(|&j| !chars[j].is_ascii_alphanumeric())
                .unwrap_or(chars.len());
            let word: String = chars[i..end].iter().collect();
            out.push_str(&normalize_word(&word));
            i = end;
            continue;
        }
        if c.is_whitespace() {
            if !out.ends_with(' ') && !out.is_empty() {
                out.push(' ');
            }
        } else {
            out.push(c);
        }
        i += 1;
    }
    let trimmed = out.trim_end();
    trimmed.chars().take(MAX_CHARS).collect()
}

fn is_uuid(chars: &[char]) -> bool {
    chars.len() >= 36
        && chars[..36].iter().enumerate().all(|(k, c)| {
            if [8, 13, 18, 23].contains(&k) {
                *c == '-'
            } else {
                c.is_ascii_hexdigit()
            }
        })
}

/// One run of ASCII letters and digits.
fn normalize_word(word: &str) -> String {
    let lower = word.to_ascii_lowercase();
    if let Some(hex) = lower.strip_prefix("0x") {
        if !hex.is_empty() && hex.chars().all(|c| c.is_ascii_hexdigit()) {
            return "<hex>".to_owned();
        }
    }
    if word.len() >= 8
        && word.chars().all(|c| c.is_ascii_hexdigit())
        && word.chars().any(|c| c.is_ascii_digit())
    {
        return "<hex>".to_owned();
    }
    // Digit runs inside a word (or the whole word): <n>.
    let mut out = String::with_capacity(word.len());
    let mut in_digits = false;
    for c in word.chars() {
        if c.is_ascii_digit() {
            if !in_digits {
                out.push_str("<n>");
                in_digits = true;
            }
        } else {
            in_digits = false;
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_numbers_and_hex_are_normalised_away() {
        let cases = [
            ("order 123 not found", "order <n> not found"),
            ("order 456 not found", "order <n> not found"),
            (
                "HTTP 503 Service Unavailable",
                "HTTP <n> Service Unavailable",
            ),
            (
                "message 01a22d90-aff3-74b3-96b1-5e6d5575f506 failed",
                "message <id> failed",
            ),
            ("req 0x9F3A timed out", "req <hex> timed out"),
            ("trace deadbeef42 lost", "trace <hex> lost"),
            ("no answer within 10s", "no answer within <n>s"),
            ("  db   timeout\n", "db timeout"),
            ("user u-42 quota 3.5 GB", "user u-<n> quota <n>.<n> GB"),
            ("", ""),
        ];
        for (input, want) in cases {
            assert_eq!(normalize(input), want, "{input:?}");
        }
    }

    #[test]
    fn fingerprints_group_by_class_and_shape() {
        let a = fingerprint(ErrorClass::Permanent, Some("order 123 not found"));
        let b = fingerprint(ErrorClass::Permanent, Some("order 9 not found"));
        let c = fingerprint(ErrorClass::Transient, Some("order 9 not found"));
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(a, "permanent: order <n> not found");
        assert_eq!(fingerprint(ErrorClass::Transient, None), "transient");
        let long = "x".repeat(500);
        assert_eq!(normalize(&long).chars().count(), 200);
    }
}
