//! The contract suite every [`QuotaStore`] passes (see the trait's contract). Each check uses
//! its own random tenant, so one store instance can run the suite several times.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use protocol::{ExecutionId, Tenant};

use super::{Admission, AdmitRequest, QuotaLimits, QuotaStore};
use crate::contract::spawn_each;

/// Generous bound for anything that should happen "promptly" on a busy 2-core machine.
const PROMPT: Duration = Duration::from_secs(20);

/// A hold no check outlives.
const LONG: Duration = Duration::from_secs(600);

fn tenant() -> Tenant {
    format!("tenant-{}", ExecutionId::new_random())
        .parse()
        .unwrap()
}

fn limits(max_active: Option<u64>, rate: Option<f64>, burst: Option<u64>) -> QuotaLimits {
    QuotaLimits::new(max_active, rate, burst).unwrap()
}

/// Runs every check.
pub async fn quota_suite(store: Arc<dyn QuotaStore>) {
    unlimited_admits_and_holds_nothing(&*store).await;
    active_cap_holds_until_release(&*store).await;
    rejections_consume_nothing(&*store).await;
    bucket_admits_burst_then_says_when(&*store).await;
    readmitting_a_holder_takes_nothing(&*store).await;
    slots_expire_after_their_hold(&*store).await;
    holders_come_soonest_expiry_first(&*store).await;
    tenants_are_independent(&*store).await;
    concurrent_admits_never_exceed_the_cap(Arc::clone(&store)).await;
    concurrent_admits_never_exceed_the_bucket(Arc::clone(&store)).await;
}

/// Admits a new random execution.
async fn admit(
    store: &dyn QuotaStore,
    tenant: &Tenant,
    limits: &QuotaLimits,
    hold: Duration,
) -> (ExecutionId, Admission) {
    let id = ExecutionId::new_random();
    (id, admit_execution(store, tenant, limits, id, hold).await)
}

/// Admits `execution`.
async fn admit_execution(
    store: &dyn QuotaStore,
    tenant: &Tenant,
    limits: &QuotaLimits,
    execution: ExecutionId,
    hold: Duration,
) -> Admission {
    let request = AdmitRequest {
        tenant,
        limits,
        execution,
        hold,
    };
    store.admit(request).await.unwrap()
}

async fn unlimited_admits_and_holds_nothing(store: &dyn QuotaStore) {
    let t = tenant();
    for _ in 0..3 {
        let (_, a) = admit(store, &t, &QuotaLimits::default(), LONG).await;
        assert_eq!(a, Admission::Admitted);
    }
    assert!(store.holders(&t, 10).await.unwrap().is_empty());
}

async fn active_cap_holds_until_release(store: &dyn QuotaStore) {
    let t = tenant();
    let l = limits(Some(2), None, None);
    let (a, first) = admit(store, &t, &l, LONG).await;
    let (b, second) = admit(store, &t, &l, LONG).await;
    assert_eq!((first, second), (Admission::Admitted, Admission::Admitted));
    let (c, third) = admit(store, &t, &l, LONG).await;
    let Admission::ActiveLimit { retry_after } = third else {
        panic!("third admit over a cap of 2: {third:?}");
    };
    assert!(retry_after >= Duration::from_secs(1), "{retry_after:?}");
    let mut held = store.holders(&t, 10).await.unwrap();
    held.sort();
    let mut expected = vec![a, b];
    expected.sort();
    assert_eq!(held, expected, "the refused execution holds nothing");
    // Releasing an unknown execution (or twice) is harmless.
    store.release(&t, &[c]).await.unwrap();
    store.release(&t, &[a]).await.unwrap();
    store.release(&t, &[a]).await.unwrap();
    assert_eq!(store.holders(&t, 10).await.unwrap(), vec![b]);
    assert_eq!(
        admit_execution(store, &t, &l, c, LONG).await,
        Admission::Admitted
    );
    let (_, over) = admit(store, &t, &l, LONG).await;
    assert!(matches!(over, Admission::ActiveLimit { .. }), "{over:?}");
    store.release(&t, &[b, c]).await.unwrap();
    assert!(store.holders(&t, 10).await.unwrap().is_empty());
}

/// A rejection for either reason takes neither a token nor a slot.
async fn rejections_consume_nothing(store: &dyn QuotaStore) {
    let t = tenant();
    // Two tokens that (for the test's length) never refill, one slot.
    let l = limits(Some(1), Some(0.0001), Some(2));
    let (a, first) = admit(store, &t, &l, LONG).await;
    assert_eq!(first, Admission::Admitted);
    let (b, refused) = admit(store, &t, &l, LONG).await;
    assert!(
        matches!(refused, Admission::ActiveLimit { .. }),
        "{refused:?}"
    );
    store.release(&t, &[a]).await.unwrap();
    assert_eq!(
        admit_execution(store, &t, &l, b, LONG).await,
        Admission::Admitted,
        "the admit refused at the cap took no token: the second token is still there"
    );
    // Bucket empty and cap reached: rate limited.
    let (c, refused) = admit(store, &t, &l, LONG).await;
    assert!(
        matches!(refused, Admission::RateLimited { .. }),
        "{refused:?}"
    );
    // A free slot but an empty bucket: still rate limited, and the slot stays free.
    store.release(&t, &[b]).await.unwrap();
    let refused = admit_execution(store, &t, &l, c, LONG).await;
    assert!(
        matches!(refused, Admission::RateLimited { .. }),
        "{refused:?}"
    );
    assert!(
        store.holders(&t, 10).await.unwrap().is_empty(),
        "a rate-limited admit holds no slot"
    );
}

async fn bucket_admits_burst_then_says_when(store: &dyn QuotaStore) {
    let t = tenant();
    let l = limits(None, Some(0.5), Some(3));
    for _ in 0..3 {
        assert_eq!(admit(store, &t, &l, LONG).await.1, Admission::Admitted);
    }
    let (_, refused) = admit(store, &t, &l, LONG).await;
    let Admission::RateLimited { retry_after } = refused else {
        panic!("fourth admit with a burst of 3: {refused:?}");
    };
    // One token at 0.5/s takes at most 2 s.
    assert!(
        retry_after > Duration::ZERO && retry_after <= Duration::from_secs(2),
        "{retry_after:?}"
    );
    assert!(
        store.holders(&t, 10).await.unwrap().is_empty(),
        "no cap, no slots"
    );
    // The bucket refills: an admit succeeds again (after about `retry_after`).
    let started = Instant::now();
    loop {
        let (_, a) = admit(store, &t, &l, LONG).await;
        if a == Admission::Admitted {
            break;
        }
        assert!(started.elapsed() < PROMPT, "the bucket never refilled");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn readmitting_a_holder_takes_nothing(store: &dyn QuotaStore) {
    let t = tenant();
    let l = limits(Some(1), Some(0.0001), Some(1));
    let (a, first) = admit(store, &t, &l, LONG).await;
    assert_eq!(first, Admission::Admitted);
    // The bucket is empty and the cap reached, yet the holder is admitted again.
    assert_eq!(
        admit_execution(store, &t, &l, a, LONG).await,
        Admission::Admitted
    );
    assert_eq!(store.holders(&t, 10).await.unwrap(), vec![a]);
}

async fn slots_expire_after_their_hold(store: &dyn QuotaStore) {
    let t = tenant();
    let l = limits(Some(1), None, None);
    let (a, first) = admit(store, &t, &l, Duration::from_millis(300)).await;
    assert_eq!(first, Admission::Admitted);
    let b = ExecutionId::new_random();
    let started = Instant::now();
    loop {
        match admit_execution(store, &t, &l, b, LONG).await {
            Admission::Admitted => break,
            Admission::ActiveLimit { .. } => {}
            other => panic!("{other:?}"),
        }
        assert!(started.elapsed() < PROMPT, "the slot never expired");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(store.holders(&t, 10).await.unwrap(), vec![b]);
    store.release(&t, &[a, b]).await.unwrap();
}

async fn holders_come_soonest_expiry_first(store: &dyn QuotaStore) {
    let t = tenant();
    let l = limits(Some(10), None, None);
    let (late, _) = admit(store, &t, &l, LONG).await;
    let (soon, _) = admit(store, &t, &l, LONG / 2).await;
    assert_eq!(store.holders(&t, 10).await.unwrap(), vec![soon, late]);
    assert_eq!(store.holders(&t, 1).await.unwrap(), vec![soon]);
    assert!(store.holders(&t, 0).await.unwrap().is_empty());
}

async fn tenants_are_independent(store: &dyn QuotaStore) {
    let (x, y) = (tenant(), tenant());
    let l = limits(Some(1), Some(0.0001), Some(1));
    assert_eq!(admit(store, &x, &l, LONG).await.1, Admission::Admitted);
    assert!(!admit(store, &x, &l, LONG).await.1.is_admitted());
    let (y1, admitted) = admit(store, &y, &l, LONG).await;
    assert_eq!(
        admitted,
        Admission::Admitted,
        "another tenant is unaffected"
    );
    assert_eq!(store.holders(&y, 10).await.unwrap(), vec![y1]);
    // Releasing in one tenant frees nothing in another.
    store.release(&x, &[y1]).await.unwrap();
    assert_eq!(store.holders(&y, 10).await.unwrap(), vec![y1]);
}

async fn concurrent_admits_never_exceed_the_cap(store: Arc<dyn QuotaStore>) {
    let t = tenant();
    let l = limits(Some(7), None, None);
    let tasks = spawn_each(&store, 40, |_, store| {
        let t = t.clone();
        async move { admit(&*store, &t, &l, LONG).await }
    });
    let mut admitted = Vec::new();
    for task in tasks {
        let (id, a) = task.await.unwrap();
        match a {
            Admission::Admitted => admitted.push(id),
            Admission::ActiveLimit { .. } => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(admitted.len(), 7, "exactly the cap is admitted");
    let mut held = store.holders(&t, 100).await.unwrap();
    held.sort();
    admitted.sort();
    assert_eq!(held, admitted);
    store.release(&t, &admitted).await.unwrap();
    assert!(store.holders(&t, 100).await.unwrap().is_empty());
}

/// Over any interval `t`, at most `burst + rate × t` admits succeed. `t` is measured around
/// every call (before the first was sent, after the last answered), so it contains the store's
/// own interval and the bound can only be generous.
async fn concurrent_admits_never_exceed_the_bucket(store: Arc<dyn QuotaStore>) {
    let t = tenant();
    let (rate, burst) = (20.0, 5);
    let l = limits(None, Some(rate), Some(burst));
    let started = Instant::now();
    let run_for = Duration::from_millis(1500);
    let tasks = spawn_each(&store, 8, |_, store| {
        let t = t.clone();
        async move {
            let mut admitted = 0u64;
            let mut refused = 0u64;
            while started.elapsed() < run_for {
                match admit(&*store, &t, &l, LONG).await.1 {
                    Admission::Admitted => admitted += 1,
                    Admission::RateLimited { .. } => refused += 1,
                    other => panic!("{other:?}"),
                }
                tokio::task::yield_now().await;
            }
            (admitted, refused)
        }
    });
    let (mut admitted, mut refused) = (0, 0);
    for task in tasks {
        let (a, r) = task.await.unwrap();
        admitted += a;
        refused += r;
    }
    let elapsed = started.elapsed().as_secs_f64();
    #[allow(clippy::cast_precision_loss)]
    let allowance = burst as f64 + rate * elapsed;
    #[allow(clippy::cast_precision_loss)]
    let got = admitted as f64;
    assert!(
        got <= allowance.floor(),
        "{admitted} admitted in {elapsed:.3} s; the bucket allows at most {allowance:.1}"
    );
    assert!(admitted >= burst, "the burst is admitted at once");
    assert!(refused > 0, "the load exceeded the rate");
}
