//! The console's sessions ([`Store::session_create`], [`Store::session_get`],
//! [`Store::session_delete`]) and the shared secret ([`Store::shared_secret`]), on one
//! handle with the fake clock: found and kept alive, touched only when due, expired after
//! the idle time, ended, a token's least recently used ones dropped past its bound and
//! nobody else's, expired ones deleted by the next create. Two handles are in
//! [`super::shared`].

use super::at;
use crate::{NewSession, SessionLookup, Store};
use std::sync::Arc;

/// The idle time of the cases, ms.
pub const IDLE_MS: u64 = 3_600_000;
/// How old `last_seen` must be before a lookup moves it, ms.
pub const TOUCH_MS: u64 = 60_000;

/// A session `id` of `token` with the cases' idle time, at most `max` per token.
pub fn new_session(id: &str, token: &str, max: u32) -> NewSession {
    NewSession {
        id: id.to_owned(),
        token: token.to_owned(),
        csrf: format!("csrf-{id}"),
        max_per_token: max,
        idle_ms: IDLE_MS,
    }
}

/// A lookup of `id` with the cases' idle and touch times.
pub fn lookup(id: &str) -> SessionLookup {
    SessionLookup {
        id: id.to_owned(),
        idle_ms: IDLE_MS,
        touch_after_ms: TOUCH_MS,
    }
}

/// A created session is found with its token and CSRF token; a lookup within the touch
/// time leaves `last_seen` alone, one after it moves it to now; the session expires
/// `idle_ms` after it was last seen, counted from the touch.
pub async fn session_is_found_touched_and_expires<S: Store>(s: Arc<S>) {
    let made = s
        .session_create(new_session("s1", "ops", 8), Some(at(0)))
        .await
        .expect("create");
    assert_eq!(
        (made.id.as_str(), made.token.as_str(), made.csrf.as_str()),
        ("s1", "ops", "csrf-s1")
    );
    assert_eq!((made.created_at, made.last_seen), (at(0), at(0)));

    let got = s
        .session_get(lookup("s1"), Some(at(10)))
        .await
        .expect("get");
    assert_eq!(
        got.as_ref(),
        Some(&made),
        "not touched within the touch time"
    );
    assert!(
        s.session_get(lookup("nobody"), Some(at(10)))
            .await
            .expect("get")
            .is_none(),
        "an unknown id is no session"
    );

    let t = TOUCH_MS as i64 + 5;
    let got = s
        .session_get(lookup("s1"), Some(at(t)))
        .await
        .expect("get")
        .expect("alive");
    assert_eq!(got.last_seen, at(t), "touched once the touch time passed");
    assert_eq!(got.created_at, at(0));
    // The touch was stored: a later lookup within the touch time sees it.
    let again = s
        .session_get(lookup("s1"), Some(at(t + 1)))
        .await
        .expect("get")
        .expect("alive");
    assert_eq!(again.last_seen, at(t));

    // Alive until idle_ms after the touch, not after the creation.
    let idle = IDLE_MS as i64;
    assert!(s
        .session_get(lookup("s1"), Some(at(idle + 10)))
        .await
        .expect("get")
        .is_some());
    // That lookup touched it again (at idle + 10): it expires idle_ms later.
    assert!(s
        .session_get(lookup("s1"), Some(at(2 * idle + 9)))
        .await
        .expect("get")
        .is_some());
    assert!(
        s.session_get(lookup("s1"), Some(at(4 * idle)))
            .await
            .expect("get")
            .is_none(),
        "expired after idle_ms without a request"
    );
}

/// A deleted session is gone; deleting it again, or an unknown id, answers false.
pub async fn session_delete_ends_it<S: Store>(s: Arc<S>) {
    s.session_create(new_session("s1", "ops", 8), Some(at(0)))
        .await
        .expect("create");
    s.session_create(new_session("s2", "ops", 8), Some(at(0)))
        .await
        .expect("create");
    assert!(s.session_delete("s1".into()).await.expect("delete"));
    assert!(s
        .session_get(lookup("s1"), Some(at(1)))
        .await
        .expect("get")
        .is_none());
    assert!(!s.session_delete("s1".into()).await.expect("again"));
    assert!(!s.session_delete("nobody".into()).await.expect("unknown"));
    assert!(
        s.session_get(lookup("s2"), Some(at(1)))
            .await
            .expect("get")
            .is_some(),
        "the token's other session is untouched"
    );
}

/// Past `max_per_token`, creating a session deletes its token's least recently used one
/// (a touch counts as a use), never another token's.
pub async fn sessions_per_token_are_bounded_least_recently_used_first<S: Store>(s: Arc<S>) {
    s.session_create(new_session("b1", "reader", 3), Some(at(0)))
        .await
        .expect("b1");
    for (i, id) in ["a1", "a2", "a3"].iter().enumerate() {
        s.session_create(new_session(id, "admin", 3), Some(at(1 + i as i64)))
            .await
            .expect("create");
    }
    // a1 is used again (a touch): a2 is now the least recently used.
    let t = TOUCH_MS as i64 + 10;
    let a1 = s
        .session_get(lookup("a1"), Some(at(t)))
        .await
        .expect("get")
        .expect("a1");
    assert_eq!(a1.last_seen, at(t));
    s.session_create(new_session("a4", "admin", 3), Some(at(t + 1)))
        .await
        .expect("a4");
    let alive = |id: &'static str| {
        let s = s.clone();
        async move {
            s.session_get(lookup(id), Some(at(t + 2)))
                .await
                .expect("get")
                .is_some()
        }
    };
    assert!(!alive("a2").await, "the least recently used went");
    for id in ["a1", "a3", "a4", "b1"] {
        assert!(alive(id).await, "{id} stays");
    }
    // A token signing in in a loop keeps its bound and signs nobody else out.
    for i in 0..10 {
        s.session_create(
            new_session(&format!("loop{i}"), "admin", 3),
            Some(at(t + 3 + i)),
        )
        .await
        .expect("loop");
    }
    assert!(alive("b1").await, "another token's session stays");
    for id in ["a1", "a3", "a4", "loop0", "loop6"] {
        assert!(!alive(id).await, "{id} went");
    }
    for id in ["loop7", "loop8", "loop9"] {
        assert!(alive(id).await, "{id} stays");
    }
}

/// Creating a session deletes every expired one, of any token: a lookup with a longer idle
/// time no longer finds them.
pub async fn expired_sessions_are_deleted_by_the_next_create<S: Store>(s: Arc<S>) {
    s.session_create(new_session("old", "reader", 8), Some(at(0)))
        .await
        .expect("old");
    let later = IDLE_MS as i64 + 1;
    // A lookup that sees a session however long ago it was seen, and never touches it.
    let forever = |id: &str| SessionLookup {
        id: id.to_owned(),
        idle_ms: 100 * IDLE_MS,
        touch_after_ms: 100 * IDLE_MS,
    };
    // Expired, but still stored until a create removes it.
    assert!(s
        .session_get(lookup("old"), Some(at(later)))
        .await
        .expect("get")
        .is_none());
    assert!(s
        .session_get(forever("old"), Some(at(later)))
        .await
        .expect("get")
        .is_some());
    s.session_create(new_session("new", "admin", 8), Some(at(later)))
        .await
        .expect("new");
    assert!(
        s.session_get(forever("old"), Some(at(later)))
            .await
            .expect("get")
            .is_none(),
        "deleted by the create"
    );
    assert!(s
        .session_get(lookup("new"), Some(at(later)))
        .await
        .expect("get")
        .is_some());
}

/// The first call of a name stores its candidate; later ones answer it, whatever they
/// offer; names are independent.
pub async fn shared_secret_is_created_once<S: Store>(s: Arc<S>) {
    let first = s
        .shared_secret("csrf".into(), "one".into())
        .await
        .expect("first");
    assert_eq!(first, "one");
    let again = s
        .shared_secret("csrf".into(), "two".into())
        .await
        .expect("again");
    assert_eq!(again, "one", "the stored secret, not the new candidate");
    let other = s
        .shared_secret("other".into(), "three".into())
        .await
        .expect("other");
    assert_eq!(other, "three");
}
