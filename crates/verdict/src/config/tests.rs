//! Precedence (flag, environment, file, default) and bounds of every setting.

use super::*;

fn serve_args() -> ServeArgs {
    ServeArgs {
        no_worker: false,
        delivery: DeliveryArgs {
            retry_interval_secs: None,
            inline_deadline_ms: None,
            destinations: DestinationArgs::default(),
        },
        listen: None,
        key_ttl_secs: None,
        lock_timeout_secs: None,
        prune_interval_secs: None,
        alert_window_secs: None,
        inbound: InboundArgs::default(),
        rate_limit: RateLimitArgs::default(),
        retention: RetentionArgs::default(),
        sets: SetArgs::default(),
        metrics_token: None,
        quota: QuotaArgs::default(),
        console: ConsoleArgs::default(),
    }
}

#[test]
fn console_sessions_last_an_idle_hour_and_12_h_at_most_unless_set_within_bounds() {
    let c = ServeConfig::resolve(&serve_args(), &FileConfig::default()).unwrap();
    assert_eq!(c.console_sessions.idle, Duration::from_secs(3600));
    assert_eq!(c.console_sessions.absolute, Duration::from_secs(12 * 3600));
    let file: FileConfig = toml::from_str("console_session_max_secs = 600").unwrap();
    let mut args = serve_args();
    args.console.console_session_idle_secs = Some(1);
    let c = ServeConfig::resolve(&args, &file).unwrap();
    assert_eq!(c.console_sessions.idle, Duration::from_secs(1));
    assert_eq!(c.console_sessions.absolute, Duration::from_secs(600));
    args.console.console_session_max_secs = Some(MAX_CONSOLE_SESSION_SECS);
    assert!(ServeConfig::resolve(&args, &file).is_ok());
    for (idle, max, setting) in [
        (Some(0), None, "VERDICT_CONSOLE_SESSION_IDLE_SECS"),
        (None, Some(0), "VERDICT_CONSOLE_SESSION_MAX_SECS"),
        (
            Some(MAX_CONSOLE_SESSION_SECS + 1),
            None,
            "VERDICT_CONSOLE_SESSION_IDLE_SECS",
        ),
        (
            None,
            Some(MAX_CONSOLE_SESSION_SECS + 1),
            "VERDICT_CONSOLE_SESSION_MAX_SECS",
        ),
    ] {
        let mut args = serve_args();
        args.console.console_session_idle_secs = idle;
        args.console.console_session_max_secs = max;
        match ServeConfig::resolve(&args, &FileConfig::default()) {
            Err(ConfigError::ConsoleSession { setting: s, .. }) => assert_eq!(s, setting),
            other => panic!("{setting}: {other:?}"),
        }
    }
}

#[test]
fn a_metrics_token_is_long_visible_ascii_and_never_printed() {
    let mut args = serve_args();
    args.metrics_token = Some("short".into());
    assert!(matches!(
        ServeConfig::resolve(&args, &FileConfig::default()),
        Err(ConfigError::MetricsToken)
    ));
    args.metrics_token = Some(format!("{} {}", "a".repeat(20), "b".repeat(20)));
    assert!(ServeConfig::resolve(&args, &FileConfig::default()).is_err());
    let token = "t".repeat(32);
    args.metrics_token = Some(token.clone());
    let c = ServeConfig::resolve(&args, &FileConfig::default()).unwrap();
    let parsed = c.metrics_token.unwrap();
    assert!(parsed.matches(&token) && !parsed.matches(&token[1..]));
    assert!(!format!("{parsed:?}").contains(&token));
}

#[test]
fn the_set_window_defaults_to_300_s_past_and_60_s_ahead_and_is_bounded() {
    let c = ServeConfig::resolve(&serve_args(), &FileConfig::default()).unwrap();
    assert_eq!(c.sets.window.max_age, Duration::from_secs(300));
    assert_eq!(c.sets.window.max_ahead, Duration::from_secs(60));
    assert_eq!(c.sets.jwks_refresh, Duration::from_secs(60));
    let file: FileConfig = toml::from_str("set_max_age_secs = 900").unwrap();
    let mut args = serve_args();
    assert_eq!(
        ServeConfig::resolve(&args, &file)
            .unwrap()
            .sets
            .window
            .max_age,
        Duration::from_secs(900)
    );
    args.sets.set_max_age_secs = Some(0);
    assert!(matches!(
        ServeConfig::resolve(&args, &file),
        Err(ConfigError::SetSetting {
            setting: "VERDICT_SET_MAX_AGE_SECS",
            ..
        })
    ));
}

#[test]
fn inbound_limits_are_bounded_and_outlast_the_delivery_deadline() {
    let c = ServeConfig::resolve(&serve_args(), &FileConfig::default()).unwrap();
    assert_eq!(c.inbound, InboundLimits::default());
    let mut args = serve_args();
    args.inbound.header_timeout_secs = Some(0);
    assert!(matches!(
        ServeConfig::resolve(&args, &FileConfig::default()),
        Err(ConfigError::InboundLimit {
            setting: "VERDICT_HEADER_TIMEOUT_SECS",
            ..
        })
    ));
    let mut args = serve_args();
    args.inbound.max_connections = Some(1_000_000);
    assert!(ServeConfig::resolve(&args, &FileConfig::default()).is_err());
    let mut args = serve_args();
    args.inbound.request_timeout_secs = Some(5);
    assert!(matches!(
        ServeConfig::resolve(&args, &FileConfig::default()),
        Err(ConfigError::RequestTimeoutTooShort { .. })
    ));
    let file: FileConfig = toml::from_str("header_timeout_secs = 2\nmax_connections = 10").unwrap();
    let c = ServeConfig::resolve(&serve_args(), &file).unwrap();
    assert_eq!(c.inbound.header_timeout, Duration::from_secs(2));
    assert_eq!(c.inbound.max_connections, 10);
    // One client's share is never more than the whole.
    assert_eq!(c.inbound.max_connections_per_client, 10);
    let mut args = serve_args();
    args.inbound.max_connections_per_client = Some(0);
    assert!(ServeConfig::resolve(&args, &FileConfig::default()).is_err());
}

#[test]
fn defaults_apply_when_nothing_is_configured() {
    let c = ServeConfig::resolve(&serve_args(), &FileConfig::default()).unwrap();
    assert_eq!(c.listen.to_string(), DEFAULT_LISTEN);
    assert_eq!(c.ingest.key_ttl_ms, 86_400_000);
    assert_eq!(c.ingest.lock_timeout_ms, 60_000);
    assert_eq!(c.delivery.deadline, Duration::from_millis(5000));
    assert_eq!(c.delivery.retry_interval, Duration::from_secs(300));
    assert_eq!(c.delivery.destinations, DestinationPolicy::default());
    assert!(c.run_worker);
}

#[test]
fn the_file_beats_defaults_and_flags_or_environment_beat_the_file() {
    let file: FileConfig = toml::from_str(
        "listen = \"127.0.0.1:9999\"\nkey_ttl_secs = 10\nretry_interval_secs = 7\n\
         allow_private_destinations = true\n",
    )
    .unwrap();
    let mut args = serve_args();
    args.key_ttl_secs = Some(20);
    let c = ServeConfig::resolve(&args, &file).unwrap();
    assert_eq!(c.listen.to_string(), "127.0.0.1:9999");
    assert_eq!(c.ingest.key_ttl_ms, 20_000, "the flag wins over the file");
    assert_eq!(c.delivery.retry_interval, Duration::from_secs(7));
    assert!(c.delivery.destinations.allow_private);
    assert!(!c.delivery.destinations.allow_link_local);
}

#[test]
fn link_local_destinations_need_their_own_setting() {
    let mut args = serve_args();
    args.delivery.destinations.allow_private_destinations = Some(true);
    let c = ServeConfig::resolve(&args, &FileConfig::default()).unwrap();
    assert!(c.delivery.destinations.allow_private);
    assert!(!c.delivery.destinations.allow_link_local);
    let file: FileConfig = toml::from_str("allow_link_local_destinations = true").unwrap();
    let c = ServeConfig::resolve(&args, &file).unwrap();
    assert!(c.delivery.destinations.allow_link_local);
}

#[test]
fn events_are_kept_90_days_unless_configured_and_never_less_than_a_key_lives() {
    let day = Duration::from_secs(86_400);
    let c = ServeConfig::resolve(&serve_args(), &FileConfig::default()).unwrap();
    assert_eq!(c.retention.events, day * 90);
    let file: FileConfig = toml::from_str("event_retention_days = 30").unwrap();
    let c = ServeConfig::resolve(&serve_args(), &file).unwrap();
    assert_eq!(c.retention.events, day * 30);
    let mut args = serve_args();
    args.retention.event_retention_days = Some(7);
    assert_eq!(
        ServeConfig::resolve(&args, &file).unwrap().retention.events,
        day * 7,
        "the environment wins over the file"
    );
    args.retention.event_retention_days = Some(0);
    assert!(matches!(
        ServeConfig::resolve(&args, &file),
        Err(ConfigError::Retention { days: 0, .. })
    ));
    args.retention.event_retention_days = Some(1);
    args.key_ttl_secs = Some(2 * 86_400);
    let err = ServeConfig::resolve(&args, &file).unwrap_err();
    assert!(err.to_string().contains("key lifetime (172800 s)"), "{err}");
}

#[test]
fn a_lock_timeout_below_one_second_is_refused() {
    let mut args = serve_args();
    args.lock_timeout_secs = Some(0);
    assert!(matches!(
        ServeConfig::resolve(&args, &FileConfig::default()),
        Err(ConfigError::LockTimeoutTooShort(0))
    ));
}

#[test]
fn the_attempt_deadline_is_bounded() {
    let mut args = serve_args();
    for ok in [1, 5000, 30_000] {
        args.delivery.inline_deadline_ms = Some(ok);
        let c = ServeConfig::resolve(&args, &FileConfig::default()).unwrap();
        assert_eq!(c.delivery.deadline, Duration::from_millis(ok));
    }
    for bad in [0, 30_001, u64::MAX] {
        args.delivery.inline_deadline_ms = Some(bad);
        let err = ServeConfig::resolve(&args, &FileConfig::default()).unwrap_err();
        assert!(matches!(err, ConfigError::Deadline { got_ms, .. } if got_ms == bad));
        assert!(err.to_string().contains("between 1 and 30000 ms"), "{err}");
    }
    // The file is held to the same bound.
    let file: FileConfig = toml::from_str("inline_deadline_ms = 45000").unwrap();
    assert!(serve_args().delivery.resolve(&file).is_err());
}

#[test]
fn the_rate_limit_defaults_to_1000_per_second_and_zero_means_unlimited() {
    let none = ServeConfig::resolve(&serve_args(), &FileConfig::default()).unwrap();
    assert_eq!(none.rate_limit_per_tenant, NonZeroU32::new(1_000));
    let file: FileConfig = toml::from_str("rate_limit_per_tenant = 7").unwrap();
    let from_file = ServeConfig::resolve(&serve_args(), &file).unwrap();
    assert_eq!(from_file.rate_limit_per_tenant, NonZeroU32::new(7));
    let mut args = serve_args();
    args.rate_limit.rate_limit_per_tenant = Some(0);
    let zero = ServeConfig::resolve(&args, &file).unwrap();
    assert_eq!(
        zero.rate_limit_per_tenant, None,
        "0 from the environment wins: unlimited"
    );
}

#[test]
fn unknown_keys_in_the_file_are_refused() {
    assert!(toml::from_str::<FileConfig>("lisen = \"x\"").is_err());
}

#[test]
fn the_master_key_file_sits_beside_the_sqlite_database() {
    assert_eq!(
        master_key_beside(Path::new("/data/verdict.db")),
        Path::new("/data/verdict.db.master-key")
    );
}
