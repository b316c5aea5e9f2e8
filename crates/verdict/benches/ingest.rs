//! `cargo bench -p verdict`: ingest throughput and latency, next to the floor.
//!
//! For each backend it runs, at the same concurrency:
//! - **verdict**: signed `POST /v1/signals` over a real socket to the real router (validation,
//!   canonical-JSON fingerprint, API key and signature check, claim, playbook, actions, recovery
//!   point, persistence);
//! - **floor**: the same store statements that request runs, issued directly, with no HTTP,
//!   JSON, crypto or playbook work: what the database alone costs.
//!
//! Scenarios: a fresh signal (new key, new subject) and a replay (a completed key). Set
//! `BENCH_REQUESTS` and `BENCH_CONCURRENCY` to change the load; PostgreSQL is skipped with a
//! note if 127.0.0.1:5432 is unreachable.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinSet;
use uuid::Uuid;
use verdict::actions::Applied;
use verdict::clock::now_ms;
use verdict::delivery::{Deliverer, DeliverySettings};
use verdict::http::{AppState, router};
use verdict::idempotency::SIGNALS_ENDPOINT;
use verdict::ingest::{Ingest, IngestSettings};
use verdict::secrets::{MasterKey, api_key_hash};
use verdict::store::{
    ActionTarget, Claim, Completion, Dispatch, KeyRef, NewEvent, Recorded, SecretPurpose, Store,
    StoredResponse,
};
use verdict::tenant::{self, CreatedTenant, TenantSpec};

struct Stats {
    requests: usize,
    elapsed: Duration,
    latencies: Vec<Duration>,
}

impl Stats {
    fn row(&self, backend: &str, scenario: &str, path: &str, concurrency: usize) {
        let mut l = self.latencies.clone();
        l.sort_unstable();
        let pct = |p: f64| l[((l.len() as f64 * p) as usize).min(l.len() - 1)].as_secs_f64() * 1e3;
        println!(
            "{backend:<9} {scenario:<13} {path:<8} {:>6} {concurrency:>5} {:>10.0} {:>8.2} {:>8.2}",
            self.requests,
            self.requests as f64 / self.elapsed.as_secs_f64(),
            pct(0.50),
            pct(0.99),
        );
    }
}

/// Runs `n` calls of `op(i)` with `concurrency` in flight and times each.
async fn run<F, Fut>(n: usize, concurrency: usize, op: F) -> Stats
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let op = Arc::new(op);
    let started = Instant::now();
    let mut tasks = JoinSet::new();
    let mut latencies = Vec::with_capacity(n);
    for i in 0..n {
        while tasks.len() >= concurrency {
            latencies.push(tasks.join_next().await.unwrap().unwrap());
        }
        let op = op.clone();
        tasks.spawn(async move {
            let t = Instant::now();
            op(i).await;
            t.elapsed()
        });
    }
    while let Some(l) = tasks.join_next().await {
        latencies.push(l.unwrap());
    }
    Stats {
        requests: n,
        elapsed: started.elapsed(),
        latencies,
    }
}

fn body(i: usize, run_id: &str) -> String {
    format!(
        r#"{{"type":"sim_swap","subject":{{"account":"bench-{run_id}-{i}"}},"observed_at":"{}","attributes":{{"carrier":"x"}},"metadata":{{"n":{i}}}}}"#,
        time::OffsetDateTime::now_utc()
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap()
    )
}

fn signed(
    client: &reqwest::Client,
    url: &str,
    tenant: &CreatedTenant,
    key: &str,
    body: String,
) -> reqwest::RequestBuilder {
    let secret = verdict_webhooks::Secret::parse(&tenant.signing_secret).unwrap();
    let ts = time::OffsetDateTime::now_utc().unix_timestamp();
    let mut content = format!("{ts}.").into_bytes();
    content.extend_from_slice(body.as_bytes());
    client
        .post(url)
        .bearer_auth(&tenant.api_key)
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .header("verdict-timestamp", ts.to_string())
        .header("verdict-signature", secret.sign_content(&content))
        .body(body)
}

/// The store calls one fresh keyed signal makes, in order, issued directly.
async fn floor_fresh(store: Arc<dyn Store>, tenant_id: Uuid, api_key: Arc<String>, i: usize) {
    let now = now_ms();
    store
        .tenant_by_api_key(&api_key_hash(&api_key))
        .await
        .unwrap();
    store
        .live_secrets(tenant_id, SecretPurpose::Inbound, now)
        .await
        .unwrap();
    store.current_playbook(tenant_id).await.unwrap();
    let event_id = Uuid::now_v7();
    let key = KeyRef {
        tenant_id,
        endpoint: SIGNALS_ENDPOINT,
        digest: Uuid::new_v4().as_bytes().repeat(2),
    };
    let lock_token = Uuid::new_v4();
    store
        .claim(&Claim {
            key: key.clone(),
            fingerprint: vec![1; 32],
            event_id,
            lock_token,
            now,
            locked_until: now + 60_000,
            expires_at: now + 86_400_000,
        })
        .await
        .unwrap();
    store.subject_locked(tenant_id, &[7; 32]).await.unwrap();
    let target = ActionTarget {
        tenant_id,
        event_id,
        subject_hash: format!("floor-subject-{i:027}").into_bytes(),
        signal_key: Uuid::new_v4().as_bytes().repeat(2),
        signal_type: "sim_swap",
        now,
    };
    store.lock_account(&target).await.unwrap();
    store.open_case(&target).await.unwrap();
    store.alert_customer(&target, 86_400_000).await.unwrap();
    store.deny_subject(&target).await.unwrap();
    let record = |_: Option<Applied>| Recorded {
        record: String::from(r#"{"decision":"deny"}"#),
        event: None,
    };
    store
        .dispatch(&Dispatch {
            target: &target,
            key: Some((&key, lock_token)),
            callback: None,
            record: &record,
        })
        .await
        .unwrap();
    store
        .complete(&Completion {
            event: Some(NewEvent {
                id: event_id,
                tenant_id,
                signal_type: "sim_swap",
                subject_hash: target.subject_hash.clone(),
                observed_at: now,
                attributes: "{}".into(),
                metadata: "{}".into(),
                decision: "deny",
                playbook_version: 0,
                rule: "floor".into(),
                actions: "[]".into(),
                created_at: now,
            }),
            key: Some((key, lock_token)),
            response: StoredResponse {
                status: 200,
                body: vec![b'{'; 300],
            },
        })
        .await
        .unwrap();
}

async fn bench_backend(name: &str, url: &str, n: usize, concurrency: usize) {
    let keys = Arc::new(
        MasterKey::from_base64(&MasterKey::generate_base64())
            .unwrap()
            .keyring(),
    );
    let store = verdict::store::connect(url).await.unwrap();
    let tenant = tenant::create(
        &*store,
        &keys,
        TenantSpec {
            name: "bench".into(),
            inbound_signature_required: true,
            callback_url: None,
        },
    )
    .await
    .unwrap();
    let deliverer = Arc::new(Deliverer::new(
        store.clone(),
        keys.clone(),
        DeliverySettings {
            deadline: Duration::from_secs(5),
            retry_interval: Duration::from_secs(300),
            allow_private: false,
        },
    ));
    let state = AppState {
        ingest: Arc::new(Ingest::new(
            store.clone(),
            keys.clone(),
            IngestSettings {
                key_ttl_ms: 86_400_000,
                lock_timeout_ms: 60_000,
                alert_window_ms: 86_400_000,
            },
            deliverer.clone(),
        )),
        deliverer,
        store: store.clone(),
        keys,
        metrics: None,
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router(state)).await.unwrap() });
    let url = Arc::new(format!("http://{addr}/v1/signals"));
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .build()
        .unwrap();
    let tenant = Arc::new(tenant);
    let run_id = Uuid::new_v4().simple().to_string();

    // Warm up connections and caches.
    for i in 0..20 {
        let r = signed(
            &client,
            &url,
            &tenant,
            &Uuid::new_v4().to_string(),
            body(i, "warm"),
        )
        .send()
        .await
        .unwrap();
        assert_eq!(r.status(), 200);
    }

    let (c, u, t, rid) = (client.clone(), url.clone(), tenant.clone(), run_id.clone());
    let fresh = run(n, concurrency, move |i| {
        let req = signed(&c, &u, &t, &Uuid::new_v4().to_string(), body(i, &rid));
        async move {
            let r = req.send().await.unwrap();
            assert_eq!(r.status(), 200);
        }
    })
    .await;
    fresh.row(name, "fresh signal", "verdict", concurrency);

    let (s, tid, key) = (
        store.clone(),
        tenant.tenant_id,
        Arc::new(tenant.api_key.clone()),
    );
    let floor = run(n, concurrency, move |i| {
        floor_fresh(s.clone(), tid, key.clone(), i)
    })
    .await;
    floor.row(name, "fresh signal", "floor", concurrency);

    // Replays: one completed key, asked for again and again.
    let replay_key = Uuid::new_v4().to_string();
    let replay_body = body(0, &format!("replay-{run_id}"));
    let first = signed(&client, &url, &tenant, &replay_key, replay_body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), 200);
    let (c, u, t) = (client.clone(), url.clone(), tenant.clone());
    let (rk, rb) = (Arc::new(replay_key), Arc::new(replay_body));
    let replays = run(n, concurrency, move |_| {
        let req = signed(&c, &u, &t, &rk, (*rb).clone());
        async move {
            let r = req.send().await.unwrap();
            assert_eq!(r.headers()["idempotent-replayed"], "true");
        }
    })
    .await;
    replays.row(name, "replay", "verdict", concurrency);

    // The replay floor: authenticate, then the claim that finds the completed row.
    let now = now_ms();
    let replay_ref = KeyRef {
        tenant_id: tenant.tenant_id,
        endpoint: SIGNALS_ENDPOINT,
        digest: vec![9; 32],
    };
    let seed = Claim {
        key: replay_ref.clone(),
        fingerprint: vec![1; 32],
        event_id: Uuid::now_v7(),
        lock_token: Uuid::new_v4(),
        now,
        locked_until: now + 60_000,
        expires_at: now + 86_400_000,
    };
    store.claim(&seed).await.unwrap();
    store
        .complete(&Completion {
            event: None,
            key: Some((replay_ref, seed.lock_token)),
            response: StoredResponse {
                status: 200,
                body: vec![b'{'; 300],
            },
        })
        .await
        .unwrap();
    let (s, tid, key) = (
        store.clone(),
        tenant.tenant_id,
        Arc::new(tenant.api_key.clone()),
    );
    let seed = Arc::new(seed);
    let replay_floor = run(n, concurrency, move |_| {
        let (s, key, seed) = (s.clone(), key.clone(), seed.clone());
        async move {
            let now = now_ms();
            s.tenant_by_api_key(&api_key_hash(&key)).await.unwrap();
            s.live_secrets(tid, SecretPurpose::Inbound, now)
                .await
                .unwrap();
            let mut claim = (*seed).clone();
            claim.now = now;
            claim.lock_token = Uuid::new_v4();
            s.claim(&claim).await.unwrap();
        }
    })
    .await;
    replay_floor.row(name, "replay", "floor", concurrency);
}

#[tokio::main]
async fn main() {
    let n: usize = std::env::var("BENCH_REQUESTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let concurrency: usize = std::env::var("BENCH_CONCURRENCY")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(16);
    println!(
        "{:<9} {:<13} {:<8} {:>6} {:>5} {:>10} {:>8} {:>8}",
        "backend", "scenario", "path", "n", "conc", "req/s", "p50 ms", "p99 ms"
    );
    let dir = std::env::temp_dir().join(format!("verdict-bench-{}", Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    bench_backend(
        "sqlite",
        &format!("sqlite://{}", dir.join("bench.db").display()),
        n,
        concurrency,
    )
    .await;
    std::fs::remove_dir_all(&dir).ok();

    let admin_url = std::env::var("VERDICT_TEST_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    match sqlx::PgPool::connect(&admin_url).await {
        Ok(admin) => {
            let db = format!("verdict_bench_{}", Uuid::new_v4().simple());
            sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {db}")))
                .execute(&admin)
                .await
                .unwrap();
            let url = format!("{}/{db}", &admin_url[..admin_url.rfind('/').unwrap()]);
            bench_backend("postgres", &url, n, concurrency).await;
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "DROP DATABASE {db} WITH (FORCE)"
            )))
            .execute(&admin)
            .await
            .ok();
        }
        Err(e) => println!("postgres: skipped, {admin_url} unreachable ({e})"),
    }
}
