//! Per-tenant rate limits: over the limit a request gets 429 with `Retry-After`, decided after
//! authentication and before the claim, so a limited signal claims no key and writes nothing.

use std::time::Duration;

use crate::common::{Backend, Reply, Server, Tenant, TestDb, new_key, now, signed, sim_swap};

/// Asserts a 429 rate-limited problem with a whole-second `Retry-After` of at least 1.
fn assert_limited(reply: &Reply) {
    assert_eq!(
        reply.status,
        429,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    assert_eq!(
        reply.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(
        reply.json()["type"],
        "https://verdict.dev/problems/rate-limited"
    );
    let secs: u64 = reply
        .header("retry-after")
        .expect("a 429 says when to retry")
        .parse()
        .expect("Retry-After in whole seconds");
    assert!(secs >= 1);
}

/// Sends `n` keyed signals at once; returns each key with its reply.
async fn burst(server: &Server, tenant: &Tenant, n: usize) -> Vec<(String, Reply)> {
    let mut set = tokio::task::JoinSet::new();
    for i in 0..n {
        let key = new_key();
        let body = sim_swap(&format!("+4477009006{i:02}"));
        let req = signed(
            server.client.post(format!("{}/v1/signals", server.base)),
            tenant,
            Some(&key),
            &body,
            now(),
        );
        set.spawn(async move { (key, Reply::from(req.send().await.unwrap()).await) });
    }
    set.join_all().await
}

/// Sends `n` GETs at once; returns the statuses.
async fn get_burst(server: &Server, tenant: &Tenant, n: usize) -> Vec<Reply> {
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..n {
        let req = server
            .client
            .get(format!("{}/v1/events", server.base))
            .bearer_auth(&tenant.api_key);
        set.spawn(async move { Reply::from(req.send().await.unwrap()).await });
    }
    set.join_all().await
}

async fn a_burst_over_the_limit_gets_429_and_claims_no_key(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let server = Server::start(&db, &[("VERDICT_RATE_LIMIT_PER_TENANT", "5")]);

    let replies = burst(&server, &tenant, 20).await;
    let admitted = replies.iter().filter(|(_, r)| r.status == 200).count();
    let limited: Vec<_> = replies.iter().filter(|(_, r)| r.status == 429).collect();
    assert_eq!(admitted + limited.len(), 20, "only 200s and 429s");
    assert!(admitted >= 5, "the burst of 5 is admitted, got {admitted}");
    assert!(
        !limited.is_empty(),
        "20 at once against 5/s must be limited"
    );
    for (_, reply) in &limited {
        assert_limited(reply);
    }
    assert_eq!(
        db.count("idempotency_keys").await,
        admitted as i64,
        "a limited signal claimed its key"
    );
    assert_eq!(db.count("events").await, admitted as i64);

    // Nothing was left behind: after waiting, a limited key is processed afresh.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let (key, _) = limited[0];
    let index = replies.iter().position(|(k, _)| k == key).unwrap();
    let body = sim_swap(&format!("+4477009006{index:02}"));
    let retried = server.send(&tenant, Some(key), &body).await;
    assert_eq!(retried.status, 200);
    assert!(!retried.replayed());
}

async fn another_tenant_keeps_its_own_budget(backend: Backend) {
    let db = TestDb::new(backend).await;
    let busy = db.tenant(&[]);
    let quiet = db.tenant(&[]);
    let server = Server::start(&db, &[("VERDICT_RATE_LIMIT_PER_TENANT", "5")]);

    let replies = get_burst(&server, &busy, 20).await;
    assert!(replies.iter().any(|r| r.status == 429));
    // Its own burst of 5: four reads and a signal.
    let quiet_replies = get_burst(&server, &quiet, 4).await;
    assert!(
        quiet_replies.iter().all(|r| r.status == 200),
        "the other tenant was limited: {:?}",
        quiet_replies.iter().map(|r| r.status).collect::<Vec<_>>()
    );
    let sent = server
        .send(&quiet, Some(&new_key()), &sim_swap("+447700900690"))
        .await;
    assert_eq!(sent.status, 200);
}

async fn the_tenants_own_limit_wins_over_the_server_setting(backend: Backend) {
    let db = TestDb::new(backend).await;
    let stricter = db.tenant(&[]);
    let looser = db.tenant(&[]);
    let cleared = db.tenant(&[]);
    let plain = db.tenant(&[]);
    let set = |tenant: &Tenant, args: &[&str]| {
        let mut all = vec!["tenant", "set-rate-limit", "--tenant", &tenant.id];
        all.extend_from_slice(args);
        db.cli(&all)
    };
    set(&stricter, &["--per-second", "2"]);
    set(&looser, &["--per-second", "100"]);
    set(&cleared, &["--per-second", "100"]);
    set(&cleared, &["--clear"]);
    let server = Server::start(&db, &[("VERDICT_RATE_LIMIT_PER_TENANT", "10")]);

    let statuses = |replies: Vec<Reply>| replies.iter().map(|r| r.status).collect::<Vec<_>>();
    let strict = get_burst(&server, &stricter, 8).await;
    let admitted = strict.iter().filter(|r| r.status == 200).count();
    assert!(
        (2..=4).contains(&admitted),
        "2/s with a burst of 2 admits about 2 of 8: {:?}",
        statuses(strict)
    );
    for reply in strict.iter().filter(|r| r.status != 200) {
        assert_limited(reply);
    }

    let loose = get_burst(&server, &looser, 30).await;
    assert!(
        loose.iter().all(|r| r.status == 200),
        "100/s beats the server's 10/s: {:?}",
        statuses(loose)
    );
    for tenant in [&cleared, &plain] {
        let replies = get_burst(&server, tenant, 30).await;
        assert!(
            replies.iter().any(|r| r.status == 429),
            "the server's 10/s applies without a tenant setting"
        );
    }
}

async fn a_replay_over_the_limit_is_refused_too(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    db.cli(&[
        "tenant",
        "set-rate-limit",
        "--tenant",
        &tenant.id,
        "--per-second",
        "1",
    ]);
    let server = Server::start(&db, &[]);
    let body = sim_swap("+447700900691");
    let key = new_key();
    let at = now();
    let post = || {
        signed(
            server.client.post(format!("{}/v1/signals", server.base)),
            &tenant,
            Some(&key),
            &body,
            at,
        )
        .send()
    };
    assert_eq!(Reply::from(post().await.unwrap()).await.status, 200);
    // The exact bytes again, at once: the replay path, but the budget of 1 is spent.
    let limited = Reply::from(post().await.unwrap()).await;
    assert_limited(&limited);
    assert!(!limited.replayed());
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let replay = Reply::from(post().await.unwrap()).await;
    assert_eq!(replay.status, 200);
    assert!(replay.replayed());
}

on_both_backends!(
    a_burst_over_the_limit_gets_429_and_claims_no_key,
    another_tenant_keeps_its_own_budget,
    the_tenants_own_limit_wins_over_the_server_setting,
    a_replay_over_the_limit_is_refused_too,
);
