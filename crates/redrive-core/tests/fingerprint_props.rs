//! Property tests of failure fingerprints (SPEC §12: "fingerprints keep what distinguishes
//! failures"):
//!
//! 1. two HTTP statuses under any label form are two groups; the same status with different
//!    ids, numbers and hex around it is one group;
//! 2. the same for SQLSTATE codes;
//! 3. without a label (no `http`, `status` or `sqlstate`, no capital letter for a reason
//!    phrase), no digit survives normalisation: every number is an id;
//! 4. a fingerprint is at most 200 characters of message after its class, whatever the input.

use proptest::prelude::*;
use redrive_core::fingerprint::{fingerprint, normalize};
use redrive_core::ErrorClass;

/// The ways error texts label an HTTP status, `{}` standing for the status.
const STATUS_FORMS: &[&str] = &[
    "HTTP {} from payments",
    "HTTP/1.1 {} from payments",
    "status {} from payments",
    "status: {} from payments",
    r#"{"status":{},"order":ID}"#,
    "Request failed with status code {}",
    "status_code={} after IDs",
    "statusCode: {}",
    "HTTP error {} for /orders/ID",
];

/// The ways error texts carry an SQLSTATE.
const SQLSTATE_FORMS: &[&str] = &[
    "SQLSTATE[{}]: General error: ID row ID",
    "ERROR: could not serialize (SQLSTATE {}) in tx ID",
    "SQLState: {} at row ID",
];

fn fill(form: &str, code: &str, id: u64) -> String {
    form.replace("{}", code).replace("ID", &id.to_string())
}

fn sqlstate() -> impl Strategy<Value = String> {
    "[0-9A-Z]{5}"
}

proptest! {
    #[test]
    fn http_statuses_split_groups_and_ids_do_not(
        form in proptest::sample::select(STATUS_FORMS),
        a in 100u16..=599,
        b in 100u16..=599,
        id1 in any::<u64>(),
        id2 in any::<u64>(),
    ) {
        let class = ErrorClass::Transient;
        let fa1 = fingerprint(class, Some(&fill(form, &a.to_string(), id1)));
        let fa2 = fingerprint(class, Some(&fill(form, &a.to_string(), id2)));
        let fb = fingerprint(class, Some(&fill(form, &b.to_string(), id1)));
        prop_assert_eq!(&fa1, &fa2, "ids split a group");
        if a != b {
            prop_assert_ne!(&fa1, &fb, "two statuses in one group");
        }
        prop_assert!(fa1.contains(&a.to_string()), "{fa1}");
    }

    #[test]
    fn sqlstates_split_groups_and_ids_do_not(
        form in proptest::sample::select(SQLSTATE_FORMS),
        a in sqlstate(),
        b in sqlstate(),
        id1 in any::<u64>(),
        id2 in any::<u64>(),
    ) {
        let class = ErrorClass::Transient;
        let fa1 = fingerprint(class, Some(&fill(form, &a, id1)));
        let fa2 = fingerprint(class, Some(&fill(form, &a, id2)));
        let fb = fingerprint(class, Some(&fill(form, &b, id1)));
        prop_assert_eq!(&fa1, &fa2, "ids split a group");
        if a != b {
            prop_assert_ne!(&fa1, &fb, "two SQLSTATEs in one group");
        }
    }

    #[test]
    fn unlabelled_numbers_are_always_normalised(s in "[a-z0-9 .:=_/#()\\[\\]-]{0,120}") {
        let lower = s.to_ascii_lowercase();
        prop_assume!(!["http", "status", "sqlstate"].iter().any(|l| lower.contains(l)));
        let n = normalize(&s);
        prop_assert!(!n.chars().any(|c| c.is_ascii_digit()), "{s:?} → {n:?}");
    }

    #[test]
    fn fingerprints_are_bounded(s in any::<String>()) {
        let n = normalize(&s);
        prop_assert!(n.chars().count() <= 200);
        let f = fingerprint(ErrorClass::Permanent, Some(&s));
        prop_assert!(f.starts_with("permanent"));
    }
}
