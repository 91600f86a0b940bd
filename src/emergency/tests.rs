//! Emergency denies unit tests: validation, tenant confinement, the places kept for the platform.

use super::*;
use crate::clock::ManualClock;

fn caller() -> Caller {
    Caller {
        tenant: "ops".into(),
        subject: "alice".into(),
        agent: "".into(),
        scopes: Default::default(),
        method: crate::identity::AuthMethod::Dev,
        claims: Default::default(),
        token: None,
        delegation: None,
    }
}

fn deny(tools: &str) -> NewDeny {
    NewDeny {
        tools: tools.into(),
        reason: "leaking data".into(),
        ..NewDeny::default()
    }
}

#[tokio::test]
async fn a_deny_matches_its_tools_tenant_and_agent_until_it_expires_or_is_cleared() {
    let clock = ManualClock::new(1_000_000);
    let denies = EmergencyDenies::in_memory(SharedClock::new(clock.clone()));
    assert!(denies.matching("send_email", "acme", "bot").is_none());
    let everyone = denies
        .set(deny("send_*"), &caller(), &Authority::Platform)
        .await
        .unwrap();
    assert_eq!(everyone.set_by, "ops/alice");
    assert!(denies.matching("send_email", "acme", "bot").is_some());
    assert!(denies.matching("search", "acme", "bot").is_none());
    let narrow = NewDeny {
        tenant: Some("globex".into()),
        agent: Some("bot".into()),
        ttl: Some(Duration::from_secs(60)),
        ..deny("search")
    };
    let narrow = denies
        .set(narrow, &caller(), &Authority::Platform)
        .await
        .unwrap();
    assert!(denies.matching("search", "globex", "bot").is_some());
    assert!(denies.matching("search", "globex", "other").is_none());
    assert!(denies.matching("search", "acme", "bot").is_none());
    assert_eq!(denies.list().len(), 2);
    clock.advance(Duration::from_secs(60));
    assert!(
        denies.matching("search", "globex", "bot").is_none(),
        "expired"
    );
    assert_eq!(denies.expire().await, [narrow]);
    assert_eq!(denies.expire().await, []);
    assert_eq!(
        denies
            .clear(&everyone.id, &Authority::Platform)
            .await
            .unwrap(),
        everyone
    );
    assert!(denies.matching("send_email", "acme", "bot").is_none());
    assert_eq!(
        denies.clear(&everyone.id, &Authority::Platform).await,
        Err(DenyError::NotFound(everyone.id.clone()))
    );
}

#[tokio::test]
async fn what_is_asked_is_checked_and_bounded() {
    let denies = EmergencyDenies::in_memory(SharedClock::default());
    let refused = |new: NewDeny| {
        let denies = &denies;
        async move {
            denies
                .set(new, &caller(), &Authority::Platform)
                .await
                .unwrap_err()
        }
    };
    assert!(matches!(
        refused(deny("")).await,
        DenyError::InvalidTools(..)
    ));
    assert!(matches!(
        refused(deny("[a")).await,
        DenyError::InvalidTools(..)
    ));
    let no_reason = NewDeny {
        reason: " ".into(),
        ..deny("x")
    };
    assert_eq!(refused(no_reason).await, DenyError::ReasonMissing);
    let long = NewDeny {
        reason: "r".repeat(MAX_REASON_BYTES + 1),
        ..deny("x")
    };
    assert_eq!(
        refused(long).await,
        DenyError::TooLong("reason", MAX_REASON_BYTES)
    );
    let blank = NewDeny {
        tenant: Some(" acme".into()),
        ..deny("x")
    };
    assert_eq!(refused(blank).await, DenyError::Blank("tenant"));
    let forever = NewDeny {
        ttl: Some(MAX_TTL + Duration::from_secs(1)),
        ..deny("x")
    };
    assert_eq!(refused(forever).await, DenyError::TtlTooLong);
    for i in 0..MAX_DENIES {
        denies
            .set(deny(&format!("t{i}")), &caller(), &Authority::Platform)
            .await
            .unwrap();
    }
    assert_eq!(refused(deny("one_more")).await, DenyError::TooMany);
}

#[tokio::test]
async fn a_tenants_admin_acts_on_its_own_tenants_denies_only() {
    let denies = EmergencyDenies::in_memory(SharedClock::default());
    let acme = Authority::Tenant("acme".into());
    let platform = Authority::Platform;
    // Naming no tenant, a tenant's admin's deny is its tenant's; naming another is refused.
    let own = denies.set(deny("send_*"), &caller(), &acme).await.unwrap();
    assert_eq!(own.tenant.as_deref(), Some("acme"));
    assert!(!own.set_by_platform);
    let other = NewDeny {
        tenant: Some("globex".into()),
        ..deny("send_*")
    };
    assert!(matches!(
        denies.set(other.clone(), &caller(), &acme).await,
        Err(DenyError::OtherTenant { .. })
    ));
    let on_globex = denies.set(other, &caller(), &platform).await.unwrap();
    let on_acme = NewDeny {
        tenant: Some("acme".into()),
        ..deny("search")
    };
    let platform_on_acme = denies.set(on_acme, &caller(), &platform).await.unwrap();
    let fleet = denies.set(deny("x"), &caller(), &platform).await.unwrap();
    assert!(fleet.set_by_platform && fleet.tenant.is_none());
    // acme sees the denies on acme, whoever set them; the platform sees all.
    let seen: Vec<String> = denies.list_for(&acme).into_iter().map(|d| d.id).collect();
    assert_eq!(seen, [own.id.clone(), platform_on_acme.id.clone()]);
    assert_eq!(denies.list_for(&platform).len(), 4);
    // acme clears its own, not the platform's on acme, and finds none of the others.
    assert_eq!(
        denies.clear(&platform_on_acme.id, &acme).await,
        Err(DenyError::SetByPlatform(platform_on_acme.id.clone()))
    );
    for id in [&on_globex.id, &fleet.id] {
        assert_eq!(
            denies.clear(id, &acme).await,
            Err(DenyError::NotFound(id.clone()))
        );
    }
    assert_eq!(denies.clear(&own.id, &acme).await.unwrap(), own);
    assert_eq!(denies.list_for(&platform).len(), 3);
}

#[tokio::test]
async fn tenants_cannot_take_the_platforms_places() {
    let denies = EmergencyDenies::in_memory(SharedClock::default());
    let tenant = |i: usize| Authority::Tenant(format!("t{i}").into());
    for i in 0..MAX_DENIES_PER_TENANT {
        denies
            .set(deny(&format!("a{i}")), &caller(), &tenant(0))
            .await
            .unwrap();
    }
    assert_eq!(
        denies.set(deny("one_more"), &caller(), &tenant(0)).await,
        Err(DenyError::TooManyForTenant)
    );
    // Every tenant's admins together leave the platform its places.
    let mut set = MAX_DENIES_PER_TENANT;
    'tenants: for t in 1.. {
        for i in 0..MAX_DENIES_PER_TENANT {
            match denies
                .set(deny(&format!("a{i}")), &caller(), &tenant(t))
                .await
            {
                Ok(_) => set += 1,
                Err(err) => {
                    assert_eq!(err, DenyError::TooMany);
                    break 'tenants;
                }
            }
        }
    }
    assert_eq!(set, MAX_DENIES - RESERVED_FOR_PLATFORM);
    for i in 0..RESERVED_FOR_PLATFORM {
        denies
            .set(deny(&format!("p{i}")), &caller(), &Authority::Platform)
            .await
            .unwrap();
    }
    assert_eq!(
        denies.set(deny("p"), &caller(), &Authority::Platform).await,
        Err(DenyError::TooMany)
    );
}

#[test]
fn a_deny_stored_without_its_setter_is_the_platforms() {
    let json = r#"{"id":"emd_1","tools":"x","tenant":"acme","agent":null,"reason":"r","set_by":"a/b","set_at_ms":1,"expires_at_ms":null,"cancel_running":false}"#;
    let deny: EmergencyDeny = serde_json::from_str(json).unwrap();
    assert!(deny.set_by_platform);
}

#[tokio::test]
async fn running_calls_are_woken_once_per_new_cancel_running_deny() {
    let denies = EmergencyDenies::in_memory(SharedClock::default());
    let stop = CancellationToken::new();
    denies.attach(stop.clone());
    let first = denies.epoch();
    denies
        .set(deny("a"), &caller(), &Authority::Platform)
        .await
        .unwrap();
    assert!(
        !first.is_cancelled(),
        "a deny without cancel_running wakes nobody"
    );
    let cancel = NewDeny {
        cancel_running: true,
        ..deny("b*")
    };
    let set = denies
        .set(cancel, &caller(), &Authority::Platform)
        .await
        .unwrap();
    assert!(first.is_cancelled());
    assert_eq!(denies.stopping("b1", &caller()).unwrap().deny, set);
    assert!(
        denies.stopping("a", &caller()).is_none(),
        "a does not stop running calls"
    );
    let second = denies.epoch();
    assert!(!second.is_cancelled());
    denies
        .set(deny("c"), &caller(), &Authority::Platform)
        .await
        .unwrap();
    assert!(!second.is_cancelled());
    // The calls' own stop reaches the epoch too.
    stop.cancel();
    assert!(second.is_cancelled());
}

#[test]
fn matching_allocates_nothing() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let denies = EmergencyDenies::in_memory(SharedClock::default());
    runtime.block_on(async {
        denies
            .set(deny("send_*"), &caller(), &Authority::Platform)
            .await
            .unwrap();
    });
    // The first load on a thread sets up arc-swap's per-thread slots, once.
    assert!(denies.matching("search", "acme", "bot").is_none());
    let allocated = crate::allocations::allocations_in(|| {
        for _ in 0..100 {
            assert!(denies.matching("search", "acme", "bot").is_none());
        }
    });
    assert_eq!(allocated, 0);
}
