//! Failure fingerprints: what makes two failures "the same" for an operator. Ids, numbers
//! and hex strings are replaced by placeholders, so `order 123 not found (req 0x9f3a)` and
//! `order 456 not found (req 0x11b2)` are one group: `permanent: order <n> not found (req <hex>)`.
//!
//! Codes that say *which* failure it was stay (SPEC §12): an HTTP status
//! (`HTTP 503` ≠ `HTTP 500`) and an SQLSTATE (`SQLSTATE[40001]`, a deadlock, ≠
//! `SQLSTATE[23000]`, a constraint). A number is read as such a code only where its text
//! says so, because a bare number is as likely an order id (`order 404 not found`):
//!
//! - **HTTP status**: three digits from 100 to 599 after a label — `HTTP 503`, `HTTP/1.1 503`,
//!   `status 503`, `status: 503`, `"status":503`, `status code 503`, `status_code=503`,
//!   `statusCode: 503`, `HTTP error 503`, `http_code=503` (labels in any case, separated by
//!   blanks, `:`, `=`, quotes or brackets) — or before its standard reason phrase with a capital
//!   (`503 Service Unavailable`, Guzzle's `` `503 Service Unavailable` response ``). A bare
//!   `got 503 from payments` is normalised: nothing says it is a status.
//! - **SQLSTATE**: the five characters after `SQLSTATE` (`SQLSTATE[40001]`, PDO and Laravel;
//!   `(SQLSTATE 40P01)`, pgx; `SQLState: 08S01`, JDBC).
//! - **MySQL error numbers** (`1213`, `1062`) are normalised: a MySQL message always carries
//!   its text (`Deadlock found when trying to get lock`, `Duplicate entry …`), which stays and
//!   already tells the failures apart, while PDO adds the SQLSTATE, which stays too. Keeping
//!   the number would add no distinction the words do not make.
//!
//! The fingerprint is computed when it is read (failure groups, a search's `fingerprint`
//! filter, alerts, tasks), never stored: a change of these rules regroups every message at
//! once, consistently, and a task created with an older fingerprint selects nothing new.

use crate::{DeadReason, ErrorClass, Message};

/// Longest normalised message kept in a fingerprint, in characters.
const MAX_CHARS: usize = 200;

/// The fingerprint of a failure: its class and its normalised message.
pub fn fingerprint(class: ErrorClass, message: Option<&str>) -> String {
    match message.map(normalize).filter(|m| !m.is_empty()) {
        Some(m) => format!("{}: {m}", class.as_str()),
        None => class.as_str().to_owned(),
    }
}

/// The fingerprint of a (dead) message: of its last error, or its dead reason (`killed`)
/// when it has none; with the last error's message as it was.
pub fn of_message(m: &Message) -> (String, Option<String>) {
    let last = m
        .last_error
        .as_ref()
        .map(|e| (e.class, e.message.as_deref()));
    (
        of_parts(last, m.dead_reason),
        m.last_error.as_ref().and_then(|e| e.message.clone()),
    )
}

/// The fingerprint of a message from its parts: the last error's class and message, else
/// its dead reason (`unknown` without either). [`of_message`] is this; a store that
/// filters by fingerprint in its queries calls it on the stored columns.
pub fn of_parts(
    last_error: Option<(ErrorClass, Option<&str>)>,
    dead_reason: Option<DeadReason>,
) -> String {
    match last_error {
        Some((class, message)) => fingerprint(class, message),
        None => dead_reason.map_or("unknown", DeadReason::as_str).to_owned(),
    }
}

/// One piece of a message: a UUID, a run of ASCII letters and digits, a run of whitespace,
/// or any other character. `start..end` are character positions in the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Uuid,
    Word,
    Space,
    Other(char),
}

#[derive(Debug, Clone, Copy)]
struct Token {
    kind: Kind,
    start: usize,
    end: usize,
}

fn tokens(chars: &[char]) -> Vec<Token> {
    let mut out = Vec::new();
    let mut i = 0;
    let alnum = |j: usize| j < chars.len() && chars[j].is_ascii_alphanumeric();
    while i < chars.len() {
        let c = chars[i];
        let starts_word = i == 0 || !chars[i - 1].is_ascii_alphanumeric();
        let (kind, end) = if starts_word && is_uuid(&chars[i..]) && !alnum(i + 36) {
            (Kind::Uuid, i + 36)
        } else if c.is_ascii_alphanumeric() {
            let end = (i..chars.len()).find(|&j| !alnum(j)).unwrap_or(chars.len());
            (Kind::Word, end)
        } else if c.is_whitespace() {
            let end = (i..chars.len())
                .find(|&j| !chars[j].is_whitespace())
                .unwrap_or(chars.len());
            (Kind::Space, end)
        } else {
            (Kind::Other(c), i + 1)
        };
        out.push(Token {
            kind,
            start: i,
            end,
        });
        i = end;
    }
    out
}

/// `message` with UUIDs as `<id>`, hex strings (`0x…`, or 8 or more hex digits with a
/// digit among them) as `<hex>`, and every other run of digits as `<n>` — except HTTP
/// statuses and SQLSTATEs (see the module doc), kept as written; whitespace collapsed; at
/// most 200 characters.
pub fn normalize(message: &str) -> String {
    let chars: Vec<char> = message.chars().collect();
    let toks = tokens(&chars);
    let text = |t: &Token| -> String { chars[t.start..t.end].iter().collect() };
    let mut out = String::with_capacity(message.len());
    for (i, t) in toks.iter().enumerate() {
        match t.kind {
            Kind::Uuid => out.push_str("<id>"),
            Kind::Word => {
                let word = text(t);
                if is_kept_code(&chars, &toks, i, &word) {
                    out.push_str(&word);
                } else {
                    out.push_str(&normalize_word(&word));
                }
            }
            Kind::Space => {
                if !out.is_empty() && !out.ends_with(' ') {
                    out.push(' ');
                }
            }
            Kind::Other(c) => out.push(c),
        }
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

/// Characters that may stand between a label and its code (`status: 503`, `"status":503`,
/// `SQLSTATE[40001]`, `status_code=503`).
fn is_separator(k: Kind) -> bool {
    matches!(
        k,
        Kind::Space | Kind::Other(':' | '=' | '[' | '(' | '"' | '\'' | '_' | '-' | '#')
    )
}

/// The index of the word before token `i`, skipping separators; `None` when something else
/// (or nothing) comes first.
fn word_before(toks: &[Token], i: usize) -> Option<usize> {
    let mut j = i;
    while j > 0 {
        j -= 1;
        match toks[j].kind {
            Kind::Word => return Some(j),
            k if is_separator(k) => {}
            _ => return None,
        }
    }
    None
}

fn word_is(chars: &[char], t: &Token, names: &[&str]) -> bool {
    let w = &chars[t.start..t.end];
    names.iter().any(|n| {
        n.chars().count() == w.len() && n.chars().zip(w).all(|(a, b)| a.eq_ignore_ascii_case(b))
    })
}

/// Whether the word at `toks[i]` is an HTTP status or an SQLSTATE by its context.
fn is_kept_code(chars: &[char], toks: &[Token], i: usize, word: &str) -> bool {
    let before = word_before(toks, i);
    if word.len() == 5 {
        if let Some(b) = before {
            if word_is(chars, &toks[b], &["sqlstate"]) {
                return true;
            }
        }
    }
    let status = match word.parse::<u16>() {
        Ok(n) if word.len() == 3 && (100..=599).contains(&n) => n,
        _ => return false,
    };
    if let Some(b) = before {
        if word_is(chars, &toks[b], &["http", "https", "status", "statuscode"]) {
            return true;
        }
        if word_is(chars, &toks[b], &["code", "error"]) {
            if let Some(bb) = word_before(toks, b) {
                if word_is(chars, &toks[bb], &["http", "status"]) {
                    return true;
                }
            }
        }
    }
    after_http_version(chars, toks, i) || before_reason_phrase(chars, toks[i].end, status)
}

/// `HTTP/1.1 503`, `HTTP/2 503`: the word `http`, `/`, a version, blanks, then token `i`.
fn after_http_version(chars: &[char], toks: &[Token], i: usize) -> bool {
    // Walk back from token `i`, one expected token at a time.
    let mut j = i;
    let step = |j: &mut usize, ok: &dyn Fn(&Token) -> bool| -> bool {
        if *j > 0 && ok(&toks[*j - 1]) {
            *j -= 1;
            true
        } else {
            false
        }
    };
    let digits =
        |t: &Token| t.kind == Kind::Word && chars[t.start..t.end].iter().all(char::is_ascii_digit);
    if !step(&mut j, &|t| t.kind == Kind::Space) || !step(&mut j, &digits) {
        return false;
    }
    if step(&mut j, &|t| t.kind == Kind::Other('.')) && !step(&mut j, &digits) {
        return false;
    }
    step(&mut j, &|t| t.kind == Kind::Other('/'))
        && step(&mut j, &|t| {
            t.kind == Kind::Word && word_is(chars, t, &["http", "https"])
        })
}

/// The standard reason phrases (RFC 9110, and the older names still sent).
const REASON_PHRASES: &[(u16, &str)] = &[
    (100, "Continue"),
    (101, "Switching Protocols"),
    (103, "Early Hints"),
    (200, "OK"),
    (201, "Created"),
    (202, "Accepted"),
    (203, "Non-Authoritative Information"),
    (204, "No Content"),
    (205, "Reset Content"),
    (206, "Partial Content"),
    (300, "Multiple Choices"),
    (301, "Moved Permanently"),
    (302, "Found"),
    (303, "See Other"),
    (304, "Not Modified"),
    (307, "Temporary Redirect"),
    (308, "Permanent Redirect"),
    (400, "Bad Request"),
    (401, "Unauthorized"),
    (402, "Payment Required"),
    (403, "Forbidden"),
    (404, "Not Found"),
    (405, "Method Not Allowed"),
    (406, "Not Acceptable"),
    (407, "Proxy Authentication Required"),
    (408, "Request Timeout"),
    (409, "Conflict"),
    (410, "Gone"),
    (411, "Length Required"),
    (412, "Precondition Failed"),
    (413, "Content Too Large"),
    (413, "Payload Too Large"),
    (413, "Request Entity Too Large"),
    (414, "URI Too Long"),
    (415, "Unsupported Media Type"),
    (416, "Range Not Satisfiable"),
    (417, "Expectation Failed"),
    (421, "Misdirected Request"),
    (422, "Unprocessable Content"),
    (422, "Unprocessable Entity"),
    (423, "Locked"),
    (424, "Failed Dependency"),
    (425, "Too Early"),
    (426, "Upgrade Required"),
    (428, "Precondition Required"),
    (429, "Too Many Requests"),
    (431, "Request Header Fields Too Large"),
    (451, "Unavailable For Legal Reasons"),
    (500, "Internal Server Error"),
    (501, "Not Implemented"),
    (502, "Bad Gateway"),
    (503, "Service Unavailable"),
    (504, "Gateway Timeout"),
    (505, "HTTP Version Not Supported"),
    (506, "Variant Also Negotiates"),
    (507, "Insufficient Storage"),
    (508, "Loop Detected"),
    (511, "Network Authentication Required"),
];

/// Whether the text from character `at` is one blank, then `status`'s reason phrase
/// (starting with a capital, otherwise in any case), then the end or a non-alphanumeric.
fn before_reason_phrase(chars: &[char], at: usize, status: u16) -> bool {
    if chars.get(at) != Some(&' ') {
        return false;
    }
    let rest = &chars[at + 1..];
    if !rest.first().is_some_and(char::is_ascii_uppercase) {
        return false;
    }
    REASON_PHRASES
        .iter()
        .filter(|(code, _)| *code == status)
        .any(|(_, phrase)| {
            let n = phrase.chars().count();
            rest.len() >= n
                && rest[..n]
                    .iter()
                    .zip(phrase.chars())
                    .all(|(a, b)| a.eq_ignore_ascii_case(&b))
                && !rest.get(n).is_some_and(char::is_ascii_alphanumeric)
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
                "message 01a22d90-aff3-74b3-96b1-5e6d5575f506 failed",
                "message <id> failed",
            ),
            ("req 0x9F3A timed out", "req <hex> timed out"),
            ("trace deadbeef42 lost", "trace <hex> lost"),
            ("no answer within 10s", "no answer within <n>s"),
            ("  db   timeout\n", "db timeout"),
            ("user u-42 quota 3.5 GB", "user u-<n> quota <n>.<n> GB"),
            ("", ""),
            // Three digits with nothing saying they are a status: an id.
            ("got 503 from payments", "got <n> from payments"),
            ("order 404 not found", "order <n> not found"),
            ("HTTP 999 odd", "HTTP <n> odd"),
            ("status 42", "status <n>"),
            ("sqlstate 1234", "sqlstate <n>"),
        ];
        for (input, want) in cases {
            assert_eq!(normalize(input), want, "{input:?}");
        }
    }

    #[test]
    fn http_statuses_are_kept() {
        let cases = [
            (
                "HTTP 503 Service Unavailable",
                "HTTP 503 Service Unavailable",
            ),
            ("HTTP/1.1 502 Bad Gateway", "HTTP/<n>.<n> 502 Bad Gateway"),
            ("HTTP/2 500 for order 77", "HTTP/<n> 500 for order <n>"),
            ("http status 429", "http status 429"),
            ("status: 500", "status: 500"),
            (r#"{"status":503,"id":99}"#, r#"{"status":503,"id":<n>}"#),
            (
                "Request failed with status code 500",
                "Request failed with status code 500",
            ),
            ("status_code=504 after 30s", "status_code=504 after <n>s"),
            ("statusCode: 401", "statusCode: 401"),
            ("HTTP error 404 for /orders/12", "HTTP error 404 for /orders/<n>"),
            ("http_code=502", "http_code=502"),
            (
                "Server error: `POST https://pay.example/v1/charges/981` resulted in a `503 Service Unavailable` response",
                "Server error: `POST https://pay.example/v<n>/charges/<n>` resulted in a `503 Service Unavailable` response",
            ),
            ("upstream said 429 Too Many Requests", "upstream said 429 Too Many Requests"),
            ("422 Unprocessable Entity: 3 errors", "422 Unprocessable Entity: <n> errors"),
        ];
        for (input, want) in cases {
            assert_eq!(normalize(input), want, "{input:?}");
        }
    }

    #[test]
    fn sqlstates_are_kept_and_mysql_numbers_normalised() {
        let cases = [
            (
                "SQLSTATE[40001]: Serialization failure: 1213 Deadlock found when trying to get lock",
                "SQLSTATE[40001]: Serialization failure: <n> Deadlock found when trying to get lock",
            ),
            (
                "SQLSTATE[23000]: Integrity constraint violation: 1062 Duplicate entry '42' for key 'PRIMARY'",
                "SQLSTATE[23000]: Integrity constraint violation: <n> Duplicate entry '<n>' for key 'PRIMARY'",
            ),
            (
                "SQLSTATE[HY000] [2002] Connection refused",
                "SQLSTATE[HY000] [<n>] Connection refused",
            ),
            (
                "ERROR: deadlock detected (SQLSTATE 40P01)",
                "ERROR: deadlock detected (SQLSTATE 40P01)",
            ),
            ("SQLState: 08S01 link failure", "SQLState: 08S01 link failure"),
        ];
        for (input, want) in cases {
            assert_eq!(normalize(input), want, "{input:?}");
        }
    }

    #[test]
    fn different_statuses_and_sqlstates_are_different_groups() {
        let t = ErrorClass::Transient;
        assert_ne!(
            fingerprint(t, Some("HTTP 503 from payments")),
            fingerprint(t, Some("HTTP 500 from payments"))
        );
        assert_eq!(
            fingerprint(t, Some("HTTP 503 from payments (req 0x1)")),
            fingerprint(t, Some("HTTP 503 from payments (req 0x2)"))
        );
        assert_ne!(
            fingerprint(
                t,
                Some("SQLSTATE[40001]: Serialization failure: 1213 Deadlock found")
            ),
            fingerprint(
                t,
                Some("SQLSTATE[23000]: Serialization failure: 1213 Deadlock found")
            )
        );
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

    #[test]
    fn parts_give_the_messages_fingerprint() {
        assert_eq!(
            of_parts(Some((ErrorClass::Permanent, Some("order 1 gone"))), None),
            "permanent: order <n> gone"
        );
        assert_eq!(of_parts(None, Some(DeadReason::Killed)), "killed");
        assert_eq!(of_parts(None, None), "unknown");
    }
}
